"""How much does each task depend on its attention? Vashishth et al. (2019)'s comparison with AttentionBaselines.

Vashishth et al. ("Attention Interpretability Across NLP Tasks", 2019) replace a trained model's attention by
uniform weights and by random permutations: a single-sequence classifier barely changes, a task where attention is
a key component (translation, pair tasks) changes a lot. Here every figure is an ``AttentionBaselines`` audit run by a
real ``pl.Trainer.validate`` on an unmodified LightningModule:

* **SST-2, reference BiLSTM** (``benchmarks/models.py``: ``AttentionClassifier``, embedding 300, BiLSTM 128, tanh
  attention, 2 epochs; trained once, cached under ``benchmarks/.cache``): the attention is the pooling; uniform
  attention = mean pooling over the real tokens;
* **SST-2, Llama-architecture classifier** (``examples/llama_sst2.py`` through ``benchmarks/models.py``, hidden 64, 2
  layers, 3 epochs; cached): the last layer's query row read by the head is replaced, every head;
* **Greek–English verse pairs** (``examples/bible_pairs.py``): "is this English verse the translation of this Greek
  verse?", one positive and one negative per verse, the negative's English drawn (seed 0) among the other verses of
  the same split with the closest English length (the same length wherever one exists); Vashishth et al.'s pair
  model, attention over the English verse's BiLSTM states conditioned on the Greek verse's mean BiLSTM state, then an
  MLP over ``[c; q; c ⊙ q; |c − q|]``; trained from scratch on the train split (fresh negatives every epoch, cached
  under ``examples/.cache``), audited on the test split (Mark, 673 verses → 1,346 pairs): uniform attention = the
  mean of the English states;
* **Greek→English translation** (``examples/translation_model.py``: Marian, 3+3 layers, d_model 128, trained from
  scratch on the bundled corpus, weights cached under ``examples/.cache``): the last decoder layer's cross-attention
  rows of the target steps are replaced, every head (each head's weight on the source ``</s>`` kept); force decoding
  (the reference translation, teacher-forced) and free decoding (the model's own greedy translation).

A classifier's output is its class distribution (``Δŷ``: total variation; a decision flips when the argmax class
changes); a translation's is the log-probability of the target (Δ log p per target token; a greedy token changes
when a step's argmax changes).

    python examples/vashishth_attention_dependence.py [--examples 0] [--verses 100] [--pair-verses 0]
                                                      [--permutations 50]
                                                      [--json examples/results/vashishth_attention_dependence.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import bible_pairs  # noqa: E402
from translation_model import ModelSettings, TranslationModule, collate, encode, train_or_load  # noqa: E402

from benchmarks.models import datamodule, reference_model, trained_llama  # noqa: E402
from lightning_xai.callbacks import AttentionBaselines  # noqa: E402
from lightning_xai.data import read_alignments  # noqa: E402
from lightning_xai.models import HFClassifier  # noqa: E402


def validate_with(module: pl.LightningModule, callbacks: List[AttentionBaselines], **data: Any) -> None:
    """``trainer.validate`` with the audits attached (each audits the 'val' loader once, on_validate)."""
    trainer = pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.validate(module, verbose=False, **data)


def classifier_row(
    task: str, model_name: str, module: pl.LightningModule, args: argparse.Namespace, samples: int = 0, **data: Any
) -> Dict[str, Any]:
    """One AttentionBaselines audit of a classifier on ``data`` (``datamodule=`` or ``dataloaders=``), as a row."""
    audit = AttentionBaselines(
        num_permutations=args.permutations, num_samples=samples or None, budget=None, seed=args.seed
    )
    validate_with(module, [audit], **data)
    record = audit.history[-1]
    m = record["metrics"]
    return {
        "task": task,
        "model": model_name,
        "examples": record["num_examples"],
        "accuracy_trained": m["uniform/accuracy_trained"],
        "accuracy_uniform": m["uniform/accuracy_uniform"],
        "uniform_changed": m["uniform/flip_fraction"],
        "uniform_tv": m["uniform/mean_delta"],
        "permutation_tv_median": m["permutation/median_delta"],
        "metrics": m,
    }


def pair_audit(
    model: bible_pairs.PairAttentionClassifier, vocab: bible_pairs.PairVocab, args: argparse.Namespace, name: str
) -> Dict[str, Any]:
    """The audit row of a pair model on the first ``args.pair_verses`` test verses' pairs (negatives: seed 0)."""
    verses = read_alignments("test")[: args.pair_verses or None]
    loader = bible_pairs.pair_loader(verses, vocab, seed=0)
    row = classifier_row(
        "Greek–English verse pairs: is the English the translation? (pair)", name, model, args, dataloaders=loader
    )
    row["examples"] = f"{row['examples']} pairs"
    return row


def pair_row(args: argparse.Namespace) -> Dict[str, Any]:
    settings = bible_pairs.PairSettings()
    train, val = read_alignments("train"), read_alignments("val")
    model, vocab, cached = bible_pairs.train_or_load(settings, train, val)
    name = "BiLSTM pair model, attention over the English conditioned on the Greek" + (", cached" if cached else "")
    row = pair_audit(model, vocab, args, name)
    row["length_only_accuracy"] = bible_pairs.length_baseline_accuracy(train, read_alignments("test"), seed=0)
    return row


def translation_rows(args: argparse.Namespace) -> List[Dict[str, Any]]:
    settings = ModelSettings()
    model, source_vocab, target_vocab, cached = train_or_load(
        settings, read_alignments("train"), read_alignments("val")
    )
    module = TranslationModule(settings, len(source_vocab), len(target_vocab))
    module.model = model
    verses = read_alignments("test")[: args.verses]
    loader = DataLoader([encode(v, source_vocab, target_vocab) for v in verses], batch_size=16, collate_fn=collate)
    force = AttentionBaselines(num_permutations=args.permutations, num_samples=None, budget=None, seed=args.seed)
    free = AttentionBaselines(
        num_permutations=args.permutations,
        num_samples=None,
        budget=None,
        seed=args.seed,
        decoding="free",
        max_new_tokens=args.max_new_tokens,
        log_prefix="free",
    )
    validate_with(module, [force, free], dataloaders=loader)
    rows = []
    for audit, decoding in ((force, "force decoding (reference)"), (free, "free decoding (greedy output)")):
        record = audit.history[-1]
        m = record["metrics"]
        rows.append(
            {
                "task": f"Greek→English translation, {decoding}",
                "model": "Marian 3+3 layers (from scratch)" + (", cached weights" if cached else ""),
                "examples": record["num_examples"],
                "uniform_changed": m["uniform/greedy_token_changed/mean"],
                "permutation_changed": m["permutation/greedy_token_changed/mean"],
                "uniform_log_prob_per_token": m["uniform/log_prob_change_per_token/mean"],
                "uniform_abs_log_prob_per_token": m["uniform/abs_log_prob_change_per_token/mean"],
                "permutation_log_prob_per_token": m["permutation/log_prob_change_per_token/mean"],
                "permutation_abs_log_prob_per_token": m["permutation/abs_log_prob_change_per_token/mean"],
                "uniform_log_prob": m["uniform/log_prob_change/mean"],
                "metrics": m,
            }
        )
    return rows


def fmt(value: Optional[float], digits: int = 3, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def table(rows: List[Dict[str, Any]]) -> str:
    header = (
        "task",
        "model",
        "examples",
        "accuracy trained → uniform",
        "decisions / greedy tokens changed: uniform",
        "greedy tokens changed: permuted (mean)",
        "Δ log p(target) per token: uniform",
        "|Δ log p| per token: uniform",
        "Δ log p per token: permuted (median)",
        "|Δ log p| per token: permuted",
        "Δŷ (TV): uniform (mean) / permuted (median)",
    )
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for r in rows:
        accuracy = f"{r['accuracy_trained']:.3f} → {r['accuracy_uniform']:.3f}" if "accuracy_trained" in r else "—"
        tv = f"{r['uniform_tv']:.4f} / {r['permutation_tv_median']:.4f}" if "uniform_tv" in r else "—"
        lines.append(
            "| "
            + " | ".join(
                [
                    r["task"],
                    r["model"],
                    str(r["examples"]),
                    accuracy,
                    fmt(r["uniform_changed"]),
                    fmt(r.get("permutation_changed")),
                    fmt(r.get("uniform_log_prob_per_token"), signed=True),
                    fmt(r.get("uniform_abs_log_prob_per_token")),
                    fmt(r.get("permutation_log_prob_per_token"), signed=True),
                    fmt(r.get("permutation_abs_log_prob_per_token")),
                    tv,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--examples", type=int, default=0, help="SST-2 dev sentences audited per classifier (0: all 872)"
    )
    parser.add_argument("--verses", type=int, default=100, help="the first N test verses (Mark) translated")
    parser.add_argument("--pair-verses", type=int, default=0, help="the first N test verses' pairs (0: all 673)")
    parser.add_argument("--permutations", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=80, help="the longest greedy translation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rows, seconds = [], {}
    bilstm = reference_model(train=True)
    rows.append(
        classifier_row(
            "SST-2 sentiment (single sequence)",
            "reference BiLSTM + tanh attention",
            bilstm,
            args,
            args.examples,
            datamodule=datamodule("sst2"),
        )
    )
    seconds["bilstm"] = round(time.perf_counter() - started, 1)
    hf, dm, _ = trained_llama()
    hf.set_attn_implementation("eager")
    rows.append(
        classifier_row(
            "SST-2 sentiment (single sequence)",
            "Llama-architecture classifier (2 layers)",
            HFClassifier(model=hf),
            args,
            args.examples,
            datamodule=dm,
        )
    )
    seconds["llama"] = round(time.perf_counter() - started - sum(seconds.values()), 1)
    rows.append(pair_row(args))
    seconds["pairs"] = round(time.perf_counter() - started - sum(seconds.values()), 1)
    rows.extend(translation_rows(args))
    seconds["translation"] = round(time.perf_counter() - started - sum(seconds.values()), 1)
    print(table(rows))
    print(f"\nseconds: {seconds}, total {time.perf_counter() - started:.0f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "seconds": seconds},
                indent=1,
                ensure_ascii=False,
            )
        )


if __name__ == "__main__":
    main()
