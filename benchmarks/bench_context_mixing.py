"""Context-mixing methods (issue 16) on MiniLM: cost per method against one gradient call; value zeroing batched.

Model: the bundled all-MiniLM-L6-v2 encoder + a seeded 2-class head through ``HuggingFaceAdapter`` (speed only);
batch: the first ``--batch-size`` SST-2 dev sentences (word pieces); target: the predicted class.

* **Per method vs gradient.** ``attribute(model, batch, m, target)`` for ``gradient`` (one forward + backward),
  ``grad_x_input``, ``attnlrp``, ``attention_norm``, ``alti``, ``grad_attention``, ``value_zeroing`` (rollout over
  all 6 layers) and ``attention_flow``, timed interleaved; the slow ones (value zeroing's rollout, attention flow's
  per-sentence max-flow) run on the first ``--slow-sentences`` sentences with ``--slow-repeats`` repeats, and their
  ratio is against a gradient call on those same sentences (timed with them).
* **Value zeroing, batched vs loops** (one layer, the last; the same ``C^L`` matrix from all three, checked):
  ``batched`` is the library's (all ``B·T`` zeroed copies in chunks of ``--vz-chunk`` rows, one layer call per
  chunk); ``token loop`` zeroes one position at a time over the whole batch (``T`` layer calls of ``B`` rows);
  ``sentence loop`` is the authors' loop (per sentence at its own length, per token: one layer call of one row).

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_context_mixing.py``
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import _common as C  # noqa: E402
from benchmarks.bench_ig import load  # noqa: E402

FAST = ("gradient", "grad_x_input", "attnlrp", "attention_norm", "alti", "grad_attention")
SLOW = ("value_zeroing", "attention_flow")


def rows_of(batch: dict, n: int) -> dict:
    """The first ``n`` rows of a word-piece batch, trimmed to their longest."""
    width = int(batch["attention_mask"][:n].sum(1).max())
    return {k: (v[:n, :width] if v.dim() == 2 else v[:n]) if torch.is_tensor(v) else v for k, v in batch.items()}


def _distance(out: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return (1.0 - torch.cosine_similarity(out, reference, dim=-1)).clamp_min(0)


def token_loop(model, batch: dict, layer: int) -> torch.Tensor:
    """``[B, T, T]`` ``C^L``: zero one position's values at a time, re-running the layer on the whole batch."""
    from lightning_xai.attribution.context_mixing._hf_internals import rerun_layer, trace

    tr = trace(model, batch)
    x, reference = tr.block_in[layer], tr.block_out[layer]
    columns = []
    for j in range(x.shape[1]):
        def zero_j(v, j=j):
            v = v.clone()
            v[:, j] = 0.0
            return v
        columns.append(_distance(rerun_layer(tr, layer, x, 1, value_edit=zero_j), reference))
    return torch.stack(columns, dim=2)


def sentence_loop(model, batch: dict, layer: int) -> torch.Tensor:
    """``[B, T, T]`` ``C^L`` the authors' way: per sentence (at its own length), per token, one layer call."""
    B, T = batch["attention_mask"].shape
    out = torch.zeros(B, T, T)
    for b in range(B):
        n = int(batch["attention_mask"][b].sum())
        one = {k: v[b:b + 1, :n] if torch.is_tensor(v) and v.dim() == 2 else v for k, v in batch.items()}
        out[b, :n, :n] = token_loop(model, one, layer)[0]
    return out


def batched(model, batch: dict, layer: int, chunk: int) -> torch.Tensor:
    from lightning_xai.attribution.context_mixing._hf_internals import trace
    from lightning_xai.attribution.context_mixing.value_zeroing import value_zeroing_matrix

    return value_zeroing_matrix(trace(model, batch), layer, internal_batch_size=chunk)


def main(argv=None) -> dict:
    parser = C.common_args(__doc__.splitlines()[0])
    parser.add_argument("--slow-sentences", type=int, default=16, help="sentences for value_zeroing / flow")
    parser.add_argument("--slow-repeats", type=int, default=3)
    parser.add_argument("--vz-sentences", type=int, default=32, help="sentences for batched vs loops")
    parser.add_argument("--vz-chunk", type=int, default=1024, help="zeroed rows per layer call (batched)")
    parser.add_argument("--weights", default="random", help="ignored (MiniLM only); for the smoke test's flags")
    args = parser.parse_args(argv)
    threads = C.set_threads(args.threads)
    if args.quick:
        args.batch_size, args.repeats, args.slow_sentences, args.slow_repeats = min(args.batch_size, 4), 2, 2, 1
        args.vz_sentences = min(args.vz_sentences, 2)
    from lightning_xai.attribution import attribute

    model, batch, target = load("minilm", args.batch_size)
    slow_batch = rows_of(batch, args.slow_sentences)
    slow_target = target[:args.slow_sentences]
    result = {"benchmark": "context_mixing", "command": C.command_line(), "env": C.environment(threads),
              "model_info": model.bench_info, "batch": C.batch_stats(batch), "slow_batch": C.batch_stats(slow_batch)}

    fast = {m: (lambda m=m: attribute(model, batch, m, target)) for m in FAST}
    times = C.interleaved(fast, repeats=args.repeats, warmup=1)
    slow = {m: (lambda m=m: attribute(model, slow_batch, m, slow_target)) for m in ("gradient", *SLOW)}
    slow_times = C.interleaved(slow, repeats=args.slow_repeats, warmup=0)
    med = {m: C.median(v) for m, v in times.items()}
    slow_med = {m: C.median(v) for m, v in slow_times.items()}
    result["seconds"] = {m: {"median": med[m], "all": v} for m, v in times.items()}
    result["slow_seconds"] = {m: {"median": slow_med[m], "all": v} for m, v in slow_times.items()}
    result["vs_gradient"] = {**{m: med[m] / med["gradient"] for m in FAST},
                             **{m: slow_med[m] / slow_med["gradient"] for m in SLOW}}

    vz_batch = rows_of(batch, args.vz_sentences)
    layer = -1 % 6
    with torch.no_grad():
        vz = {"batched": lambda: batched(model, vz_batch, layer, args.vz_chunk),
              "token_loop": lambda: token_loop(model, vz_batch, layer),
              "sentence_loop": lambda: sentence_loop(model, vz_batch, layer)}
        vz_times = C.interleaved(vz, repeats=args.slow_repeats, warmup=0)
        maps = {k: fn() for k, fn in vz.items()}
    vz_med = {k: C.median(v) for k, v in vz_times.items()}
    present = vz_batch["attention_mask"].bool()
    keep = present.unsqueeze(1) & present.unsqueeze(2)
    result["value_zeroing"] = {
        "batch": C.batch_stats(vz_batch), "layer": layer, "chunk": args.vz_chunk,
        "seconds": {k: {"median": vz_med[k], "all": v} for k, v in vz_times.items()},
        "speedup_vs_token_loop": vz_med["token_loop"] / vz_med["batched"],
        "speedup_vs_sentence_loop": vz_med["sentence_loop"] / vz_med["batched"],
        "max_abs_diff": {k: float((maps[k] - maps["batched"]).masked_fill(~keep, 0).abs().max())
                         for k in ("token_loop", "sentence_loop")}}
    result["met"] = {"attnlrp_le_2x_gradient": result["vs_gradient"]["attnlrp"] <= 2.0,
                     "value_zeroing_ge_3x_token_loop": result["value_zeroing"]["speedup_vs_token_loop"] >= 3.0,
                     "value_zeroing_ge_3x_sentence_loop": result["value_zeroing"]["speedup_vs_sentence_loop"] >= 3.0}
    result["markdown"] = markdown(result)
    path = C.save("context_mixing", result, args.out)
    print(result["markdown"])
    print(f"\nsaved {path}")
    return result


def markdown(r: dict) -> str:
    b, s, v = r["batch"], r["slow_batch"], r["value_zeroing"]
    lines = [f"**Context-mixing methods, MiniLM**, {b['sentences']} SST-2 dev sentences (T_max {b['max_len']}), "
             f"{r['env']['threads']} threads, {r['env']['utc']}, load {r['env']['loadavg_1_5_15']}.", "",
             f"Command: `{r['command']}`", ""]
    rows = [(m, r["seconds"][m]["median"], len(r["seconds"][m]["all"]), b["sentences"], r["vs_gradient"][m])
            for m in FAST]
    rows += [(m, r["slow_seconds"][m]["median"], len(r["slow_seconds"][m]["all"]), s["sentences"],
              r["vs_gradient"][m]) for m in SLOW]
    lines.append(C.table(rows, ("method", "median s", "repeats", "sentences", "× one gradient call (same batch)")))
    lines += ["", f"Value zeroing, layer {v['layer']} only, {v['batch']['sentences']} sentences (T_max "
              f"{v['batch']['max_len']}), chunks of {v['chunk']} zeroed rows:", ""]
    rows = [(k, v["seconds"][k]["median"], len(v["seconds"][k]["all"]),
             v["seconds"][k]["median"] / v["seconds"]["batched"]["median"], v["max_abs_diff"].get(k, 0.0))
            for k in ("batched", "token_loop", "sentence_loop")]
    lines.append(C.table(rows, ("implementation", "median s", "repeats", "× batched", "max abs diff vs batched")))
    lines += ["", "Targets: " + ", ".join(f"{k}: {'yes' if ok else '**no**'}" for k, ok in r["met"].items()) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
