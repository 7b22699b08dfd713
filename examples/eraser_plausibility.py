"""Plausibility vs faithfulness on ERASER Movie Reviews (DeYoung et al., 2020).

Trains the reference BiLSTM + tanh-attention classifier on the bundled ERASER movies training split, then scores
six token maps of the 199 test reviews — attention, gradient, gradient×input, Integrated Gradients,
leave-one-out and LRP — plus a random map, against

* the human rationales (plausibility): token F1 and IOU F1 (span IOU ≥ 0.5) of the top-|rationale| tokens,
  and AUPRC of the soft map;
* the model itself (faithfulness): ERASER comprehensiveness and sufficiency, each the AOPC over the top
  {1, 5, 10, 20, 50}% of tokens (deleting tokens, never replacing them).

Long documents: reviews average ~780 whitespace tokens. Every split is **truncated to its first
``--max-length`` tokens** (256 by default) by ``TextClassificationDataModule(max_length=...)``; the model is
trained and evaluated on that window, and plausibility is measured against the human rationale tokens that
fall inside it (about 24% of the test rationale tokens at 256; the count is printed). Reviews whose window holds
no rationale token have no AUPRC and are left out of its mean (the count is printed too).

Signs: gradient×input, IG, leave-one-out and LRP are *signed* (evidence for the predicted class ranks first);
the gradient map is the L2 norm (unsigned); attention is a distribution.

Run (one command, well under 15 minutes on 2 CPU cores)::

    python examples/eraser_plausibility.py            # prints a markdown table
    python examples/eraser_plausibility.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from typing import Dict, List

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_xai.attribution import attribute
from lightning_xai.data import TextClassificationDataModule
from lightning_xai.metrics.functional import aopc, auprc, iou_f1, token_f1
from lightning_xai.models import AttentionClassifier

METHODS = {
    "attention": ("attention", {}),
    "gradient (L2)": ("gradient", {}),
    "grad × input": ("grad_x_input", {}),
    "integrated gradients": ("integrated_gradients", {}),
    "leave-one-out": ("leave_one_out", {"signed": True}),
    "LRP (ε=1e-3)": ("lrp", {}),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-length", type=int, default=256, help="keep the first N tokens of each review")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--embedding-dim", type=int, default=32)
    parser.add_argument("--hidden-dim", type=int, default=16)
    parser.add_argument("--embedding-std", type=float, default=0.2)
    parser.add_argument("--min-freq", type=int, default=2)
    parser.add_argument("--ig-steps", type=int, default=20)
    parser.add_argument("--eval-batch-size", type=int, default=32)
    parser.add_argument("--limit-test", type=int, default=None, help="evaluate only the first N test reviews")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    return parser.parse_args()


def train(args: argparse.Namespace, dm: TextClassificationDataModule, workdir: str) -> AttentionClassifier:
    pl.seed_everything(args.seed, verbose=False)
    model = AttentionClassifier(
        dm.vocab_size,
        dm.num_classes,
        embedding_dim=args.embedding_dim,
        hidden_dim=args.hidden_dim,
        embedding_std=args.embedding_std,
        lr=args.lr,
        vocab=dm.vocab.itos,
    )
    best = ModelCheckpoint(dirpath=workdir, monitor="val/acc", mode="max", save_top_k=1)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=False,
        callbacks=[best],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=workdir,
        deterministic=True,
    )
    trainer.fit(model, datamodule=dm)
    print(f"best epoch by val accuracy: {best.best_model_score:.3f} ({best.best_model_path.split('/')[-1]})")
    return AttentionClassifier.load_from_checkpoint(best.best_model_path).eval()


def evaluate(args: argparse.Namespace, model: AttentionClassifier, dm: TextClassificationDataModule) -> Dict:
    dataset = dm.dataset("test")
    count = len(dataset) if args.limit_test is None else min(args.limit_test, len(dataset))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(dataset, range(count)),
        batch_size=args.eval_batch_size,
        collate_fn=dm.test_dataloader().collate_fn,
    )
    generator = torch.Generator().manual_seed(args.seed)
    names = list(METHODS) + ["random"]
    values: Dict[str, Dict[str, List[float]]] = {
        n: {k: [] for k in ("token_f1", "iou_f1", "auprc", "comp", "suff")} for n in names
    }
    seconds = {n: 0.0 for n in names}
    correct, total, lrp_delta, lrp_logit = 0, 0, [], []
    for batch in loader:
        mask, rationale = batch["mask"], batch["rationale"]
        with torch.no_grad():
            prediction = model(batch).logits.argmax(-1)
        correct += int((prediction == batch["labels"]).sum())
        total += len(prediction)
        for name in names:
            start = time.perf_counter()
            if name == "random":
                scores = torch.rand(mask.shape, generator=generator) * mask
            else:
                method, options = METHODS[name]
                if method == "integrated_gradients":
                    options = {"n_steps": args.ig_steps}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if method == "lrp":
                        scores, delta = attribute(
                            model,
                            batch,
                            method,
                            target=prediction,
                            bias_factor=1.0,
                            eps=1e-3,
                            return_convergence_delta=True,
                        )
                        logit = model(batch).logits.detach().gather(1, prediction[:, None])[:, 0]
                        lrp_delta += delta.abs().tolist()
                        lrp_logit += logit.abs().tolist()
                        # the plausibility map: Arras et al.'s default rule (biases absorb their share)
                        scores = attribute(model, batch, method, target=prediction, **options)
                    else:
                        scores = attribute(model, batch, method, target=prediction, **options)
            seconds[name] += time.perf_counter() - start
            _, _, f1 = token_f1(scores, rationale, mask)
            values[name]["token_f1"] += f1.tolist()
            values[name]["iou_f1"] += iou_f1(scores, rationale, mask).tolist()
            values[name]["auprc"] += auprc(scores, rationale, mask).tolist()
            comp, suff = aopc(model, batch, scores, target=prediction)
            values[name]["comp"] += comp.tolist()
            values[name]["suff"] += suff.tolist()
        print(f"  evaluated {total}/{count} reviews", flush=True)
    rows = []
    for name in names:
        auprcs = np.array(values[name]["auprc"], dtype=float)
        rows.append(
            {
                "method": name,
                "token_f1": float(np.mean(values[name]["token_f1"])),
                "iou_f1": float(np.mean(values[name]["iou_f1"])),
                "auprc": float(np.nanmean(auprcs)),
                "comprehensiveness": float(np.mean(values[name]["comp"])),
                "sufficiency": float(np.mean(values[name]["suff"])),
                "seconds": seconds[name],
            }
        )
    no_rationale = int(np.isnan(np.array(values["attention"]["auprc"], dtype=float)).sum())
    delta, logit = np.array(lrp_delta), np.array(lrp_logit)
    worst = int(np.argmax(delta)) if len(delta) else 0
    return {
        "rows": rows,
        "test_accuracy": correct / total,
        "reviews": total,
        "no_rationale_in_window": no_rationale,
        "lrp_median_rel_conservation_error": float(np.median(delta / logit)) if len(delta) else math.nan,
        "lrp_max_abs_conservation_error": float(delta[worst]) if len(delta) else math.nan,
        "lrp_logit_at_max_error": float(logit[worst]) if len(delta) else math.nan,
    }


def markdown(result: Dict) -> str:
    lines = [
        "| map | token F1 ↑ | IOU F1 ↑ | AUPRC ↑ | comprehensiveness ↑ | sufficiency ↓ | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['method']} | {row['token_f1']:.3f} | {row['iou_f1']:.3f} | {row['auprc']:.3f} | "
            f"{row['comprehensiveness']:.3f} | {row['sufficiency']:.3f} | {row['seconds']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    dm = TextClassificationDataModule(
        "eraser_movies", batch_size=args.batch_size, max_length=args.max_length, min_freq=args.min_freq, seed=args.seed
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.setup("fit")
        dm.setup("test")
    for warning in caught:
        if "truncated" in str(warning.message):
            print("truncation:", warning.message)
    kept = sum(sum(e.rationale) for e in dm.examples("test"))
    print(f"vocabulary {dm.vocab_size} words; {kept} test rationale tokens inside the {args.max_length}-token window")
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        model = train(args, dm, workdir)
    trained = time.perf_counter()
    result = evaluate(args, model, dm)
    result.update(
        {
            "config": vars(args),
            "train_seconds": trained - started,
            "total_seconds": time.perf_counter() - started,
            "test_rationale_tokens_in_window": kept,
        }
    )
    print(
        f"\nERASER movies test ({result['reviews']} reviews, first {args.max_length} tokens): accuracy "
        f"{result['test_accuracy']:.3f}; {result['no_rationale_in_window']} reviews without rationale tokens in "
        f"the window (left out of AUPRC); LRP conservation (bias_factor=1): median |ΣR − logit| / |logit| "
        f"{result['lrp_median_rel_conservation_error']:.2e}, largest |ΣR − logit| "
        f"{result['lrp_max_abs_conservation_error']:.2e} (at |logit| {result['lrp_logit_at_max_error']:.2e})"
    )
    print(markdown(result))
    print(f"\ntrain {result['train_seconds']:.0f} s, total {result['total_seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
