"""Reproduce Jain & Wallace (2019)'s SST figures with the reference BiLSTM + tanh attention model.

Trains ``AttentionClassifier`` (embedding 300 -> BiLSTM 128/direction -> tanh attention -> linear) on the
bundled SST-2 with Jain & Wallace's pipeline (punctuation and bracket tokens stripped, train/test sentences of
more than 5 tokens, ``<sos>``/``<eos>`` read by the LSTM but masked out of attention; Adam lr 1e-3 amsgrad,
weight decay 1e-5 except attention; batch 32; 8 epochs, best epoch by dev ROC-AUC), then measures on the
test set, per sentence over its real tokens:

* attention α;
* their gradient importance |Σ_d g_d·e_d| with g = ∂σ(logit)/∂e of the predicted class and the attention
  weights *detached* (treated as constants, their ``batch_data.detach = True``; key ``XxE[X]``);
* their leave-one-out |p(ŷ|x) − p(ŷ|x without token t)|, the token deleted (the sentence gets one shorter);
* Kendall τ-b between each pair (``scipy.stats.kendalltau``), reported as mean ± std over sentences with the
  fraction of sentences whose p ≤ 0.05.

When the shared ``lightning_xai.attribution`` / ``lightning_xai.metrics`` modules are present, the same maps are
recomputed with them (``attribute(..., "grad_x_input", absolute=True)`` through an adapter that detaches the
attention, ``attribute(..., "leave_one_out")``, ``kendall_tau``) and the largest difference is printed.

Usage (see examples/RESULTS_jain_wallace.md for the figures this produced)::

    python examples/jain_wallace_sst.py                         # the reproduction (MiniLM word-piece init)
    python examples/jain_wallace_sst.py --embedding-init normal --embedding-std 1.0   # PyTorch's default init
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from scipy.stats import kendalltau
from torch import Tensor

from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.models import AttentionClassifier

#: Jain & Wallace (2019), SST, BiLSTM + tanh attention, as summarised in the project's design notes: test accuracy
#: and mean per-instance Kendall τ.
JW_FIGURES = {
    "accuracy": "0.808",
    "attention_gradient": "0.34–0.36",
    "attention_loo": "0.27–0.32",
    "gradient_loo": "0.66",
}
PAIRS = (("attention", "gradient"), ("attention", "loo"), ("gradient", "loo"))


# --- Jain & Wallace's importance measures, written out with torch.autograd ---------------------------------------
def jw_gradient(model: AttentionClassifier, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """Attention, predicted-class probability and |Σ_d (∂p/∂e)_d e_d| with the attention detached.

    Jain & Wallace differentiate σ(logit) of their single output; with two softmax classes p₀ = 1 − p₁, so the
    predicted class's |∂p/∂e| is the same number.
    """
    with torch.no_grad():
        out = model(batch)
    attention = out.attention.detach()
    embeddings = model.embed(batch).detach().requires_grad_(True)
    logits = model.forward_from_embeddings(embeddings, batch, attention_override=attention).logits
    predicted = logits.argmax(-1)
    prob = logits.softmax(-1).gather(1, predicted[:, None]).squeeze(1)
    (grad,) = torch.autograd.grad(prob.sum(), embeddings)
    mask = batch["mask"]
    gradient = (grad * embeddings).sum(-1).abs().detach().masked_fill(~mask, 0.0)
    return {"attention": attention, "gradient": gradient, "prob": prob.detach(), "predicted": predicted}


def jw_leave_one_out(model: AttentionClassifier, batch: Dict[str, Tensor], prob: Tensor, predicted: Tensor) -> Tensor:
    """``[B, T]`` |p(ŷ|x) − p(ŷ|x without token t)| for each real token t (the token deleted)."""
    mask = batch["mask"]
    input_mask = batch.get("input_mask", mask)
    ids, real, owner, where = [], [], [], []
    for row in range(mask.shape[0]):
        columns = input_mask[row].nonzero().flatten()  # the row's non-pad columns, in order
        row_ids, row_real = batch["input_ids"][row][columns], mask[row][columns]
        for position in row_real.nonzero().flatten().tolist():
            keep = torch.ones(row_ids.numel(), dtype=torch.bool)
            keep[position] = False
            ids.append(row_ids[keep])
            real.append(row_real[keep])
            owner.append(row)
            where.append(int(columns[position]))
    width = max(x.numel() for x in ids)
    variants = {
        "input_ids": torch.zeros(len(ids), width, dtype=torch.long),
        "mask": torch.zeros(len(ids), width, dtype=torch.bool),
        "input_mask": torch.zeros(len(ids), width, dtype=torch.bool),
    }
    for i, (x, m) in enumerate(zip(ids, real)):
        variants["input_ids"][i, : x.numel()] = x
        variants["mask"][i, : x.numel()] = m
        variants["input_mask"][i, : x.numel()] = True
    with torch.no_grad():
        probs = model(variants).logits.softmax(-1)
    owner_t = torch.tensor(owner)
    new = probs.gather(1, predicted[owner_t][:, None]).squeeze(1)
    scores = torch.zeros_like(mask, dtype=torch.float32)
    scores[owner_t, torch.tensor(where)] = (new - prob[owner_t]).abs()
    return scores


def per_instance_tau(a: Tensor, b: Tensor, mask: Tensor) -> List[tuple]:
    """scipy's Kendall τ-b and p-value for every row over its real tokens (NaN rows are kept as NaN)."""
    out = []
    for row in range(mask.shape[0]):
        x, y = a[row][mask[row]].numpy(), b[row][mask[row]].numpy()
        result = kendalltau(x, y)
        out.append((float(result.statistic), float(result.pvalue)))
    return out


# --- the shared library's functions, for a cross-check -------------------------------------------------------
def shared_maps(model: AttentionClassifier, batch: Dict[str, Tensor]) -> Optional[Dict[str, Tensor]]:
    try:
        from lightning_xai.attribution import attribute
    except ImportError:
        return None
    return {
        "gradient": attribute(model, batch, "grad_x_input", absolute=True, detach_attention=True),
        "gradient_attached": attribute(model, batch, "grad_x_input", absolute=True),
        "loo": attribute(model, batch, "leave_one_out"),
    }


def shared_tau(a: Tensor, b: Tensor, mask: Tensor) -> Optional[Tensor]:
    try:
        from lightning_xai.metrics.functional import kendall_tau
    except ImportError:
        return None
    return kendall_tau(a, b, mask)[0]


# --- the run -------------------------------------------------------------------------------------------------
def summarise(values: List[tuple]) -> Dict[str, float]:
    taus = np.array([t for t, _ in values], dtype=float)
    pvals = np.array([p for _, p in values], dtype=float)
    ok = ~np.isnan(taus)
    return {
        "mean": float(taus[ok].mean()),
        "std": float(taus[ok].std()),
        "significant": float((pvals[ok] <= 0.05).mean()),
        "n": int(ok.sum()),
        "nan": int((~ok).sum()),
    }


def audit(
    model: AttentionClassifier,
    dm: TextClassificationDataModule,
    limit: Optional[int],
    batch_size: int = 32,
    cross_check: bool = True,
) -> Dict[str, Any]:
    model.eval()
    dataset = dm.dataset("test")
    n = len(dataset) if limit is None else min(limit, len(dataset))
    taus: Dict[str, List[tuple]] = {f"{a}_{b}": [] for a, b in PAIRS}
    check = {"gradient_max_abs_diff": 0.0, "loo_max_abs_diff": 0.0, "tau_max_abs_diff": 0.0}
    attached: List[tuple] = []
    peak: List[float] = []
    entropy_ratio: List[float] = []
    shared_ok = cross_check
    for start in range(0, n, batch_size):
        batch = collate([dataset[i] for i in range(start, min(n, start + batch_size))])
        mask = batch["mask"]
        maps = jw_gradient(model, batch)
        maps["loo"] = jw_leave_one_out(model, batch, maps["prob"], maps["predicted"])
        for a, b in PAIRS:
            taus[f"{a}_{b}"].extend(per_instance_tau(maps[a], maps[b], mask))
        # how peaked attention is: max weight, and entropy / log(length) (1 = uniform)
        attention, length = maps["attention"], mask.sum(1).double()
        entropy = -(attention.clamp_min(1e-12).log() * attention).sum(1).double()
        peak.extend(attention.max(1).values.tolist())
        entropy_ratio.extend((entropy / length.log().clamp_min(1e-12)).tolist())
        if shared_ok:
            shared = shared_maps(model, batch)
            tau = shared_tau(maps["attention"], maps["gradient"], mask) if shared is not None else None
            if shared is None or tau is None:
                shared_ok = False
                continue
            for key in ("gradient", "loo"):
                diff = (shared[key] - maps[key]).abs().max().item()
                check[f"{key}_max_abs_diff"] = max(check[f"{key}_max_abs_diff"], diff)
            ours = torch.tensor(
                [t for t, _ in per_instance_tau(maps["attention"], maps["gradient"], mask)], dtype=torch.float64
            )
            finite = ~torch.isnan(ours)
            check["tau_max_abs_diff"] = max(
                check["tau_max_abs_diff"], (tau[finite] - ours[finite]).abs().max().item() if finite.any() else 0.0
            )
            attached.extend(per_instance_tau(maps["attention"], shared["gradient_attached"], mask))
    result: Dict[str, Any] = {
        "n": n,
        "tau": {k: summarise(v) for k, v in taus.items()},
        "attention_max_mean": float(np.mean(peak)),
        "attention_entropy_ratio_mean": float(np.mean(entropy_ratio)),
    }
    if shared_ok:
        result["shared_library_check"] = check
        result["tau_attention_gradient_not_detached"] = summarise(attached)
    return result


def build(
    args: argparse.Namespace,
    dm: TextClassificationDataModule,
    embedding_init: str,
    embeddings_path: Optional[str],
    embedding_rms: Optional[float],
) -> AttentionClassifier:
    return AttentionClassifier(
        dm.vocab_size,
        dm.num_classes,
        encoder="bilstm",
        attention="tanh",
        embedding_dim=args.embedding_dim,
        hidden_dim=args.hidden_dim,
        embedding_std=args.embedding_std,
        lr=1e-3,
        weight_decay=1e-5,
        embedding_init=embedding_init,
        embeddings_path=embeddings_path,
        embedding_rms=embedding_rms,
        embedding_oov=args.embedding_oov,
    )


def fit(
    args: argparse.Namespace,
    dm: TextClassificationDataModule,
    model: AttentionClassifier,
    out: Path,
    epochs: int,
    name: str,
) -> tuple:
    shutil.rmtree(out / "checkpoints" / name, ignore_errors=True)  # a previous run's best must not linger
    checkpoint = pl.callbacks.ModelCheckpoint(
        dirpath=out / "checkpoints" / name,
        monitor="val/auroc",
        mode="max",
        filename="best-{epoch}",
        save_weights_only=True,
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        deterministic=True,
        default_root_dir=out,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[checkpoint],
        logger=pl.loggers.CSVLogger(out, name=name),
    )
    start = time.perf_counter()
    trainer.fit(model, dm)
    seconds = time.perf_counter() - start
    best = AttentionClassifier.load_from_checkpoint(checkpoint.best_model_path)
    best_epoch = int(Path(checkpoint.best_model_path).stem.split("epoch=")[1])
    return trainer, best, best_epoch, float(checkpoint.best_model_score), seconds


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--embedding-init", default="minilm", choices=["normal", "file", "minilm"])
    parser.add_argument(
        "--embedding-rms",
        type=float,
        default=0.2,
        help="RMS entry of the source vectors (fastText's is ~0.2); ignored for 'normal'",
    )
    parser.add_argument("--embeddings-path", default=None, help="vector file for --embedding-init file")
    parser.add_argument("--embedding-std", type=float, default=1.0, help="std of 'normal' (and 'normal' OOV) rows")
    parser.add_argument("--embedding-oov", default="zero", choices=["zero", "normal"])
    parser.add_argument("--embedding-dim", type=int, default=300)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument(
        "--stage1-epochs",
        type=int,
        default=0,
        help="two-stage recipe: train a first model this long, start the reported model from its "
        "vectors rescaled to --embedding-rms",
    )
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--audit-limit", type=int, default=None, help="audit only the first N test sentences")
    parser.add_argument("--no-cross-check", action="store_true", help="skip the shared-library cross-check")
    parser.add_argument(
        "--checkpoint", default=None, help="skip training: test and audit this checkpoint (e.g. a previous run's best)"
    )
    parser.add_argument("--out", default="runs/jain_wallace")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    t0, cpu0 = time.perf_counter(), time.process_time()
    pl.seed_everything(args.seed, verbose=False)
    dm = TextClassificationDataModule(
        "sst2", batch_size=32, seed=args.seed, jain_wallace_preprocessing=True, add_sos_eos=True
    )
    dm.setup("fit")
    init, path, rms = args.embedding_init, args.embeddings_path, args.embedding_rms
    if init == "normal":
        rms = None
    stage1 = None
    if args.stage1_epochs:
        from lightning_xai.models.embeddings import save_word_vectors

        first = build(args, dm, init, path, rms)
        _, first_best, first_epoch, _, first_seconds = fit(args, dm, first, out, args.stage1_epochs, "stage1")
        path = str(out / "stage1_vectors.pt")
        save_word_vectors(first_best.vocab, first_best.embedding.weight, path)
        init, rms = "file", args.embedding_rms
        stage1 = {
            "init": args.embedding_init,
            "epochs": args.stage1_epochs,
            "best_epoch": first_epoch,
            "train_seconds": round(first_seconds, 1),
        }
        pl.seed_everything(args.seed, verbose=False)
    if args.checkpoint:
        best, report, best_auroc, train_seconds = (
            AttentionClassifier.load_from_checkpoint(args.checkpoint),
            None,
            float("nan"),
            0.0,
        )
        best_epoch = int(torch.load(args.checkpoint, map_location="cpu", weights_only=False).get("epoch", -1))
        init = best.hparams.embedding_init
        trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=out)
    else:
        model = build(args, dm, init, path, rms)
        trainer, best, best_epoch, best_auroc, train_seconds = fit(args, dm, model, out, args.epochs, "model")
        report = model.embedding_init_report
    test = trainer.test(best, datamodule=dm, verbose=False)[0]
    t1 = time.perf_counter()
    audits = audit(best, dm, args.audit_limit, cross_check=not args.no_cross_check)
    t2 = time.perf_counter()
    results = {
        "seed": args.seed,
        "checkpoint": args.checkpoint,
        "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "embedding_init": {
            "method": init,
            "found": report.found if report else None,
            "total": report.total if report else None,
            "scale": report.scale if report else None,
            "rms": report.rms if report else None,
            "stage1": stage1,
        },
        "best_epoch": best_epoch,
        "dev_auroc": best_auroc,
        "test_accuracy": test["test/acc"],
        "test_auroc": test.get("test/auroc"),
        **audits,
        "seconds": {
            "train": round(train_seconds, 1),
            "train_and_test": round(t1 - t0, 1),
            "audit": round(t2 - t1, 1),
            "total": round(t2 - t0, 1),
            "cpu_total": round(time.process_time() - cpu0, 1),
        },
        "threads": torch.get_num_threads(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(format_table(results))
    return results


def format_table(results: Dict[str, Any]) -> str:
    origin = f"checkpoint {results['checkpoint']}" if results.get("checkpoint") else f"seed {results['seed']}"
    lines = [
        f"Jain & Wallace (2019), SST, BiLSTM + tanh attention — {origin}, embedding init "
        f"{results['embedding_init']['method']!r}, best epoch {results['best_epoch']} (dev ROC-AUC "
        f"{results['dev_auroc']:.3f}), {results['n']} test sentences",
        f"{'':34}{'ours':>26}   J&W",
        f"{'test accuracy':34}{results['test_accuracy']:>26.3f}   {JW_FIGURES['accuracy']}",
    ]
    names = {
        "attention_gradient": "Kendall τ attention ↔ gradient",
        "attention_loo": "Kendall τ attention ↔ LOO",
        "gradient_loo": "Kendall τ gradient ↔ LOO",
    }
    for key, label in names.items():
        s = results["tau"][key]
        cell = f"{s['mean']:.3f} ± {s['std']:.3f} (p≤.05 {s['significant']:.0%})"
        lines.append(f"{label:34}{cell:>26}   {JW_FIGURES[key]}")
    lines.append(
        f"attention peakedness: mean max weight {results['attention_max_mean']:.3f}, mean entropy / "
        f"log(length) {results['attention_entropy_ratio_mean']:.3f} (1 = uniform)"
    )
    if "shared_library_check" in results:
        c = results["shared_library_check"]
        s = results["tau_attention_gradient_not_detached"]
        lines.append(
            f"shared library: max |Δ| gradient {c['gradient_max_abs_diff']:.1e}, LOO "
            f"{c['loo_max_abs_diff']:.1e}, τ {c['tau_max_abs_diff']:.1e}; τ attention ↔ gradient with "
            f"attention NOT detached: {s['mean']:.3f} ± {s['std']:.3f}"
        )
    sec = results["seconds"]
    lines.append(
        f"wall time: train {sec['train']:.0f} s, train+test {sec['train_and_test']:.0f} s, audits "
        f"{sec['audit']:.0f} s, total {sec['total']:.0f} s on {results['threads']} thread(s); process CPU "
        f"time {sec['cpu_total']:.0f} s (what a quiet machine needs, not slowed by other load)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
