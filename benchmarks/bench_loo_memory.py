"""Leave-one-out on one long document: peak memory and time of the chunked rerun buffers vs one buffer.

The reference BiLSTM scores the L deletions of a row by rerunning one direction's recurrence per variant
(``AttentionClassifier.deletion_logits``); the rerun outputs of all variants take Σ_b L_b² × H floats,
2 GiB for one 2,000-token row if they live in one buffer. Configurations, on the same model and row:

* ``chunked``    ``deletion_logits(..., max_elements=DELETION_BUDGET_ELEMENTS)`` — the default: the variants run
  in chunks whose rerun buffers hold at most 64M floats (256 MiB).
* ``one_buffer`` ``max_elements=None``: every variant's reruns in one buffer (the path before the budget).
* ``attribute``  ``attribute(model, batch, "leave_one_out")`` (memory only): what a user calls, default budget.

The row is the first 2,000 tokens of the first ERASER movie review (train split) that long, encoded with the
SST-2 vocabulary of the reference model (embedding 300, BiLSTM 128 per direction, tanh attention; seeded
random weights unless ``--weights trained``: weights change neither memory nor time). Timings are interleaved,
median of ``--repeats``; peak memory is the growth of peak RSS in a fresh process per configuration.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_loo_memory.py``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness as H  # noqa: E402
from benchmarks import models as M  # noqa: E402

LENGTH = 2000
MEMORY_TARGET_MIB = 512.0
TIME_TARGET = 1.2
CONFIGS = ("chunked", "one_buffer", "attribute")


def long_row(length: int):
    """``{"input_ids", "mask"}`` of one row: the first ``length`` tokens of the first long ERASER review."""
    import torch

    from lightning_xai.data.readers import read_split

    review = next(e for e in read_split("eraser_movies", "train") if len(e.tokens) >= length)
    ids = torch.tensor([M.datamodule("sst2").vocab.encode(review.tokens[:length])])
    return {"input_ids": ids, "mask": torch.ones_like(ids, dtype=torch.bool)}


def configs(model, batch):
    import torch

    from lightning_xai.attribution import attribute
    from lightning_xai.models.classifier import DELETION_BUDGET_ELEMENTS

    rows, positions = batch["mask"].nonzero(as_tuple=True)

    def deletions(budget):
        def call():
            with torch.no_grad():
                return model.deletion_logits(model.embed(batch), batch, rows, positions, max_elements=budget)

        return call

    return {
        "chunked": deletions(DELETION_BUDGET_ELEMENTS),
        "one_buffer": deletions(None),
        "attribute": lambda: attribute(model, batch, "leave_one_out", 0),
    }


def setup(args):
    H.set_threads(args.threads)
    model = M.reference_model(train=args.weights == "trained")
    return model, long_row(args.length)


def memory_of(args) -> dict:
    model, batch = setup(args)
    fn = configs(model, batch)[args.memory_of]
    print(f"PEAK_RSS_DELTA_MB={H.peak_rss_delta_mb(fn):.1f}")
    return {}


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=LENGTH, help="tokens in the row")
    parser.add_argument("--weights", default="random", choices=["trained", "random"])
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--memory-of", choices=CONFIGS, default=None, help=argparse_hidden())
    args = parser.parse_args(argv)
    if args.memory_of:  # the child process of one peak-memory measurement
        return memory_of(args)
    threads = H.set_threads(args.threads)
    if args.quick:
        args.length, args.repeats, args.no_memory = min(args.length, 64), min(args.repeats, 2), True
    model, batch = setup(args)
    result = {
        "benchmark": "leave_one_out_memory",
        "command": H.command_line(),
        "env": H.environment(threads),
        "model_info": getattr(model, "bench_info", {}),
        "batch": M.batch_stats(batch),
    }
    fns = configs(model, batch)
    outputs = {}

    def keep(name):
        def call():
            outputs[name] = fns[name]()

        return call

    times = H.interleaved({k: keep(k) for k in ("chunked", "one_buffer")}, repeats=args.repeats, warmup=0)
    med = {k: H.median(v) for k, v in times.items()}
    result["seconds"] = {k: {"median": med[k], "all": v} for k, v in times.items()}
    result["max_abs_logit_diff"] = float((outputs["chunked"] - outputs["one_buffer"]).abs().max())
    memory = {}
    if not args.no_memory:
        extra = ["--length", str(args.length), "--weights", args.weights]
        if args.threads:
            extra += ["--threads", str(args.threads)]
        memory = {name: H.memory_in_subprocess("benchmarks.bench_loo_memory", name, extra) for name in CONFIGS}
    result["peak_rss_delta_mib"] = memory
    result["ratios"] = {"time_chunked_vs_one_buffer": med["chunked"] / med["one_buffer"]}
    result["met"] = {"time_chunked_vs_one_buffer": result["ratios"]["time_chunked_vs_one_buffer"] <= TIME_TARGET}
    if memory:
        result["met"]["peak_memory_chunked"] = memory["chunked"] <= MEMORY_TARGET_MIB
        result["met"]["peak_memory_attribute"] = memory["attribute"] <= MEMORY_TARGET_MIB
    result["markdown"] = markdown(result)
    print(f"{result['markdown']}\n\nsaved {H.save('loo_memory', result, args.out)}")
    return result


def markdown(r: dict) -> str:
    b, med, mem = r["batch"], {k: v["median"] for k, v in r["seconds"].items()}, r["peak_rss_delta_mib"]
    lines = [
        f"**Leave-one-out on one {b['max_len']}-token row** (reference BiLSTM, {r['model_info'].get('weights')}); "
        f"{r['env']['threads']} threads, {r['env']['utc']}, load {r['env']['loadavg_1_5_15']}.",
        "",
        f"Command: `{r['command']}`",
        "",
    ]
    rows = [(k, med[k], H.fmt(mem[k]) if k in mem else "n/a") for k in ("chunked", "one_buffer")]
    if "attribute" in mem:
        rows.append(("attribute(…, 'leave_one_out')", "n/a", H.fmt(mem["attribute"])))
    lines.append(H.table(rows, ("configuration", "median s", "peak RSS growth MiB")))
    lines += ["", f"Max |chunked − one_buffer| logit = {r['max_abs_logit_diff']:.2e}.", ""]
    trows = [
        H.target_row(
            "time chunked / one buffer",
            r["ratios"]["time_chunked_vs_one_buffer"],
            f"≤ {TIME_TARGET:g}×",
            r["met"]["time_chunked_vs_one_buffer"],
        )
    ]
    for key, what in (("chunked", "peak memory, chunked (MiB)"), ("attribute", "peak memory, attribute (MiB)")):
        if key in mem:
            trows.append(H.target_row(what, mem[key], f"≤ {MEMORY_TARGET_MIB:g}", r["met"][f"peak_memory_{key}"]))
    lines.append(H.table(trows, ("figure", "value", "target", "met?")))
    return "\n".join(lines)


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
