"""Context-mixing methods (issue 16) on MiniLM: cost per method against one gradient call; value zeroing batched.

Model: the bundled all-MiniLM-L6-v2 encoder + a seeded 2-class head through ``HuggingFaceAdapter`` (speed only);
batch: the first ``--batch-size`` SST-2 dev sentences (word pieces); target: the predicted class.

* **Per method vs gradient.** ``attribute(model, batch, m, target)`` for ``gradient`` (one forward + backward),
  ``grad_x_input``, ``attnlrp``, ``attention_norm``, ``alti``, ``grad_attention``, ``value_zeroing`` (rollout over
  all 6 layers) and ``attention_flow``, timed interleaved; the slow ones (value zeroing's rollout, attention flow's
  per-sentence max-flow) run on the first ``--slow-sentences`` sentences with ``--slow-repeats`` repeats, and their
  ratio is against a gradient call on those same sentences (timed with them).
* **Value zeroing, batched vs loops** (one layer, the last; the same ``C^L`` matrix from all three, checked):
  ``batched`` is the library's (one row per pair of real positions ``(i, j)``, with query ``i``'s output
  projection minus ``j``'s mixed vector, through the layer's tail — residual, norms, feed-forward — in chunks;
  the attention half of the layer is not re-run); ``token loop`` zeroes one position at a time over the whole
  batch (``T`` layer calls of ``B`` rows); ``sentence loop`` is the authors' loop (per sentence at its own length,
  per token: one layer call of one row). Timed twice, ``--vz-repeats`` each: the zeroing alone from the traced
  forward each needs (one batched forward; one per sentence for the authors' loop), and end to end with it.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_context_mixing.py``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from benchmarks import models as M  # noqa: E402

FAST = ("gradient", "grad_x_input", "attnlrp", "attention_norm", "alti", "grad_attention")
SLOW = ("value_zeroing", "attention_flow")


def rows_of(batch: dict, n: int) -> dict:
    """The first ``n`` rows of a word-piece batch, trimmed to their longest."""
    width = int(batch["attention_mask"][:n].sum(1).max())
    return {k: (v[:n, :width] if v.dim() == 2 else v[:n]) if torch.is_tensor(v) else v for k, v in batch.items()}


def _distance(out: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return (1.0 - torch.cosine_similarity(out, reference, dim=-1)).clamp_min(0)


def token_loop(tr, layer: int) -> torch.Tensor:
    """``[B, T, T]`` ``C^L`` from a trace: zero one position's values at a time, re-running the layer on the whole
    batch."""
    from lightning_xai.attribution.context_mixing._hf_internals import rerun_layer

    x, reference = tr.block_in[layer], tr.block_out[layer]
    columns = []
    for j in range(x.shape[1]):

        def zero_j(v, j=j):
            v = v.clone()
            v[:, j] = 0.0
            return v

        columns.append(_distance(rerun_layer(tr, layer, x, 1, value_edit=zero_j), reference))
    return torch.stack(columns, dim=2)


def sentences(batch: dict) -> list:
    """Each row of ``batch`` alone at its own length (the authors' loop runs one sentence at a time)."""
    return [
        {
            k: v[b : b + 1, : int(batch["attention_mask"][b].sum())] if torch.is_tensor(v) and v.dim() == 2 else v
            for k, v in batch.items()
        }
        for b in range(batch["attention_mask"].shape[0])
    ]


def sentence_loop(traces: list, width: int, layer: int) -> torch.Tensor:
    """``[B, T, T]`` ``C^L`` the authors' way: per sentence (at its own length), per token, one layer call."""
    out = torch.zeros(len(traces), width, width)
    for b, tr in enumerate(traces):
        n = tr.block_in[layer].shape[1]
        out[b, :n, :n] = token_loop(tr, layer)[0]
    return out


def batched(tr, batch: dict, layer: int, chunk) -> torch.Tensor:
    from lightning_xai.attribution.context_mixing.value_zeroing import value_zeroing_matrix

    return value_zeroing_matrix(tr, layer, internal_batch_size=chunk, present=batch["attention_mask"].bool())


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.add_argument("--slow-sentences", type=int, default=16, help="sentences for value_zeroing / flow")
    parser.add_argument("--slow-repeats", type=int, default=3)
    parser.add_argument("--vz-sentences", type=int, default=32, help="sentences for batched vs loops")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(FAST),
        choices=FAST,
        help="the methods timed on the whole batch against gradient (default: all)",
    )
    parser.add_argument("--vz-repeats", type=int, default=5, help="timed repeats of batched vs loops")
    parser.add_argument(
        "--vz-chunk",
        type=int,
        default=None,
        help="zeroed copies per tail call (batched; default: the library's TAIL_ROWS rows)",
    )
    parser.add_argument("--weights", default="random", help="ignored (MiniLM only); for the smoke test's flags")
    args = parser.parse_args(argv)
    threads = H.set_threads(args.threads)
    if args.quick:
        args.batch_size, args.repeats, args.slow_sentences, args.slow_repeats = min(args.batch_size, 4), 2, 2, 1
        args.vz_sentences, args.vz_repeats = min(args.vz_sentences, 2), 1
    from lightning_xai.attribution import attribute

    model, batch, target = M.model_batch_target("minilm", args.batch_size)
    slow_batch = rows_of(batch, args.slow_sentences)
    slow_target = target[: args.slow_sentences]
    result = {
        "benchmark": "context_mixing",
        "command": H.command_line(),
        "env": H.environment(threads),
        "model_info": model.bench_info,
        "batch": M.batch_stats(batch),
        "slow_batch": M.batch_stats(slow_batch),
    }

    methods = tuple(dict.fromkeys(("gradient", *args.methods)))
    fast = {m: (lambda m=m: attribute(model, batch, m, target)) for m in methods}
    times = H.interleaved(fast, repeats=args.repeats, warmup=1)
    slow = {m: (lambda m=m: attribute(model, slow_batch, m, slow_target)) for m in ("gradient", *SLOW)}
    slow_times = H.interleaved(slow, repeats=args.slow_repeats, warmup=0)
    med = {m: H.median(v) for m, v in times.items()}
    slow_med = {m: H.median(v) for m, v in slow_times.items()}
    result["seconds"] = {m: {"median": med[m], "all": v} for m, v in times.items()}
    result["slow_seconds"] = {m: {"median": slow_med[m], "all": v} for m, v in slow_times.items()}
    result["vs_gradient"] = {
        **{m: med[m] / med["gradient"] for m in methods},
        **{m: slow_med[m] / slow_med["gradient"] for m in SLOW},
    }

    from lightning_xai.attribution.context_mixing._hf_internals import trace

    vz_batch = rows_of(batch, args.vz_sentences)
    singles = sentences(vz_batch)
    width = vz_batch["attention_mask"].shape[1]
    layer = -1 % 6
    with torch.no_grad():
        tr, traces = trace(model, vz_batch), [trace(model, one) for one in singles]
        # the zeroing alone, from the traced forward each implementation needs (the same for all, not timed) ...
        vz = {
            "batched": lambda: batched(tr, vz_batch, layer, args.vz_chunk),
            "token_loop": lambda: token_loop(tr, layer),
            "sentence_loop": lambda: sentence_loop(traces, width, layer),
        }
        # ... and end to end, the traced forward(s) included
        vz_e2e = {
            "batched": lambda: batched(trace(model, vz_batch), vz_batch, layer, args.vz_chunk),
            "token_loop": lambda: token_loop(trace(model, vz_batch), layer),
            "sentence_loop": lambda: sentence_loop([trace(model, one) for one in singles], width, layer),
        }
        vz_times = H.interleaved(vz, repeats=args.vz_repeats, warmup=1)
        e2e_times = H.interleaved(vz_e2e, repeats=args.vz_repeats, warmup=0)
        maps = {k: fn() for k, fn in vz.items()}
    vz_med = {k: H.median(v) for k, v in vz_times.items()}
    e2e_med = {k: H.median(v) for k, v in e2e_times.items()}
    present = vz_batch["attention_mask"].bool()
    keep = present.unsqueeze(1) & present.unsqueeze(2)
    result["value_zeroing"] = {
        "batch": M.batch_stats(vz_batch),
        "layer": layer,
        "chunk": args.vz_chunk,
        "seconds": {k: {"median": vz_med[k], "all": v} for k, v in vz_times.items()},
        "seconds_end_to_end": {k: {"median": e2e_med[k], "all": v} for k, v in e2e_times.items()},
        "speedup_vs_token_loop": vz_med["token_loop"] / vz_med["batched"],
        "speedup_vs_sentence_loop": vz_med["sentence_loop"] / vz_med["batched"],
        "end_to_end_speedup_vs_token_loop": e2e_med["token_loop"] / e2e_med["batched"],
        "end_to_end_speedup_vs_sentence_loop": e2e_med["sentence_loop"] / e2e_med["batched"],
        "max_abs_diff": {
            k: float((maps[k] - maps["batched"]).masked_fill(~keep, 0).abs().max())
            for k in ("token_loop", "sentence_loop")
        },
    }
    result["met"] = {
        **(
            {"attnlrp_le_2x_gradient": result["vs_gradient"]["attnlrp"] <= 2.0}
            if "attnlrp" in result["vs_gradient"]
            else {}
        ),
        "value_zeroing_ge_3x_token_loop": result["value_zeroing"]["speedup_vs_token_loop"] >= 3.0,
        "value_zeroing_ge_3x_sentence_loop": result["value_zeroing"]["speedup_vs_sentence_loop"] >= 3.0,
    }
    result["markdown"] = markdown(result)
    path = H.save("context_mixing", result, args.out)
    print(result["markdown"])
    print(f"\nsaved {path}")
    return result


def markdown(r: dict) -> str:
    b, s, v = r["batch"], r["slow_batch"], r["value_zeroing"]
    lines = [
        f"**Context-mixing methods, MiniLM**, {b['sentences']} SST-2 dev sentences (T_max {b['max_len']}), "
        f"{r['env']['threads']} threads, {r['env']['utc']}, load {r['env']['loadavg_1_5_15']}.",
        "",
        f"Command: `{r['command']}`",
        "",
    ]
    rows = [
        (m, r["seconds"][m]["median"], len(r["seconds"][m]["all"]), b["sentences"], r["vs_gradient"][m])
        for m in r["seconds"]
    ]
    rows += [
        (m, r["slow_seconds"][m]["median"], len(r["slow_seconds"][m]["all"]), s["sentences"], r["vs_gradient"][m])
        for m in SLOW
    ]
    lines.append(H.table(rows, ("method", "median s", "repeats", "sentences", "× one gradient call (same batch)")))
    lines += [
        "",
        f"Value zeroing, layer {v['layer']} only, {v['batch']['sentences']} sentences (T_max "
        f"{v['batch']['max_len']}), chunks of {v['chunk'] or 'TAIL_ROWS'} {'zeroed copies' if v['chunk'] else 'rows'} per tail call:",
        "",
    ]
    e2e = v["seconds_end_to_end"]
    rows = [
        (
            k,
            v["seconds"][k]["median"],
            len(v["seconds"][k]["all"]),
            v["seconds"][k]["median"] / v["seconds"]["batched"]["median"],
            e2e[k]["median"],
            e2e[k]["median"] / e2e["batched"]["median"],
            v["max_abs_diff"].get(k, 0.0),
        )
        for k in ("batched", "token_loop", "sentence_loop")
    ]
    lines.append(
        H.table(
            rows,
            (
                "implementation",
                "zeroing s (median)",
                "repeats",
                "× batched",
                "with its traced forward(s) s",
                "× batched",
                "max abs diff vs batched",
            ),
        )
    )
    lines += ["", "Targets: " + ", ".join(f"{k}: {'yes' if ok else '**no**'}" for k, ok in r["met"].items()) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
