"""Pruthi et al. (2020) on a decoder trained from scratch: can a small Llama hide the pronouns from its attention?

The Llama-architecture classifier of ``examples/llama_sst2.py`` (word-level vocabulary of the bundled data, hidden 64,
2 layers, 4 query heads sharing 2 key/value heads, rotary positions, right padding with id 0, random init) is
trained on the bundled ``pronoun`` task (gender of the pronoun in a Wikipedia sentence; impermissible tokens = the
pronouns) once per weight in ``--weights``, from the same initial weights and the same batches: weight 0 trains
without penalty, the others with ``DeceptionPenalty(weight, reduction, layers)`` = −λ·mean_{b,h} log(1 − a_{b,h}),
a_{b,h} the attention mass of the pooled query row (each sentence's last real token, which the head reads) on the
pronouns, head h of the chosen layers (default the last).

Reported per run, with the helpers of ``examples/hf_pronoun_deception.py``: dev and test accuracy; the impermissible
mass of the last layer's pooled row (mean over heads, max head, and the adapter's attention renormalised over real
tokens); and whether gradient and leave-one-out still find the pronouns on a fixed dev subset.

With causal attention a row sees only the tokens up to itself; the last real token's row is the only one that sees
the whole sentence, and the pronoun can also reach it through the states of the tokens after it, which attend to the
pronoun themselves. A small mass in that row says the last layer's final read-out does not look at the pronoun
directly, nothing more.

Usage (the setting of examples/RESULTS_hf.md)::

    OMP_NUM_THREADS=1 nice -n 19 python examples/llama_pronoun_deception.py --train-limit 2000 --epochs 4 \\
        --weights 0 1 --output examples/results/llama_pronoun.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from typing import Any, Dict, List

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from hf_pronoun_deception import TrainingTrace, dev_attention_mass, pronoun_finding  # noqa: E402
from llama_sst2 import DecoderSST2, decoder_collate, tiny_llama  # noqa: E402

from lightning_xai.losses import DeceptionPenalty  # noqa: E402
from lightning_xai.models import HFClassifier  # noqa: E402


def pronoun_collate(items: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    """The decoder batch plus the word-level keys ``pronoun_finding`` reads (one token = one word here)."""
    batch = decoder_collate(items)
    positions = torch.arange(batch["mask"].shape[1]).expand_as(batch["mask"])
    batch["word_ids"] = positions.masked_fill(~batch["mask"], -1)
    batch["word_mask"], batch["word_impermissible"] = batch["mask"], batch["impermissible"]
    return batch


class DecoderPronoun(DecoderSST2):
    """The bundled pronoun task for the decoder: the first ``train_limit`` training sentences (file order)."""

    collator = staticmethod(pronoun_collate)

    def __init__(self, train_limit: int = 0, **kwargs: Any) -> None:
        self.train_limit = train_limit
        super().__init__("pronoun", **kwargs)

    def _prepare(self, examples, split):
        examples = super()._prepare(examples, split)
        return examples[: self.train_limit] if split == "train" and self.train_limit else examples

    def loader_settings(self):
        return super().loader_settings()._replace(collate_fn=pronoun_collate)


@torch.no_grad()
def pooled_mass_per_layer(module: HFClassifier, dm: DecoderPronoun, split: str = "val") -> Dict[str, Any]:
    """Per layer, the pooled row's impermissible mass (mean over heads and sentences), and what uniform attention
    over each sentence's real tokens would give (#pronouns / #tokens, the chance level of that mass)."""
    dataset, sums, uniform = dm.dataset(split), None, 0.0
    module.eval()
    for start in range(0, len(dataset), 64):
        batch = dm.collator([dataset[i] for i in range(start, min(start + 64, len(dataset)))])
        out = module(batch)
        masses = [
            float(DeceptionPenalty(layers=layer).masses(out, batch).mean(1).sum())
            for layer in range(len(out.raw_attentions))
        ]
        sums = masses if sums is None else [a + b for a, b in zip(sums, masses)]
        uniform += float((batch["impermissible"].sum(-1) / batch["mask"].sum(-1)).sum())
    return {"mass_mean_heads_by_layer": [value / len(dataset) for value in sums], "uniform": uniform / len(dataset)}


def run(weight: float, args: argparse.Namespace) -> Dict[str, Any]:
    pl.seed_everything(args.seed, verbose=False)
    dm = DecoderPronoun(args.train_limit, batch_size=args.batch_size, seed=args.seed)
    dm.setup("fit")
    longest = max(len(e.tokens) for split in ("train", "val", "test") for e in dm.examples(split))
    penalty = DeceptionPenalty(weight=weight, reduction="mean", layers=args.penalty_layers) if weight > 0 else None
    module = HFClassifier(
        model=tiny_llama(dm.vocab_size, args.hidden, args.layers, args.seed, max(128, longest)),
        lr=args.lr,
        weight_decay=0.01,
        objectives=[penalty] if penalty is not None else [],
    )
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[TrainingTrace(args.log_every, penalty)],
    )
    cpu_start = time.process_time()
    trainer.fit(module, datamodule=dm)
    fit_cpu = time.process_time() - cpu_start
    result = {
        "weight": weight,
        "penalised_layers": args.penalty_layers if penalty is not None else None,
        "pooling": module.adapter.pooling,
        "steps": trainer.global_step,
        "vocab_size": dm.vocab_size,
        "val": dev_attention_mass(module, dm),
        "test": dev_attention_mass(module, dm, split="test"),
        "val_by_layer": pooled_mass_per_layer(module, dm),
        "saliency_finds_pronouns": pronoun_finding(module, dm, args.audit_samples, args.seed),
        "fit_cpu_seconds": round(fit_cpu, 1),
        "run_cpu_seconds": round(time.process_time() - cpu_start, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-limit", type=int, default=2000, help="first N training sentences (0 = all 9,017)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument(
        "--penalty-layers",
        type=int,
        nargs="+",
        default=[-1],
        help="layers whose pooled row the penalty reads (default the last)",
    )
    parser.add_argument("--audit-samples", type=int, default=128)
    parser.add_argument("--log-every", type=int, default=0, help="print loss and penalised mass every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    cpu_start = time.process_time()
    runs = [run(weight, args) for weight in args.weights]
    summary = {
        "model": "LlamaForSequenceClassification from scratch (examples/llama_sst2.py tiny_llama)",
        "task": "pronoun (Pruthi et al. 2020)",
        "args": vars(args),
        "runs": runs,
        "process_cpu_seconds": round(time.process_time() - cpu_start, 1),
        "load_average_at_end": os.getloadavg(),
    }
    print(json.dumps(summary, indent=1))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
    return summary


if __name__ == "__main__":
    main()
