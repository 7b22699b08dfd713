"""How well does LRP agree with Integrated Gradients and leave-one-out on SST-2 — and do the saliency methods
pass the sanity checks on this model?

Trains the reference BiLSTM + tanh-attention classifier on the bundled SST-2 training split and reports, over
the test sentences, the mean ± std of the per-sentence Kendall τ-b (over real tokens) between token maps:
LRP (Arras et al.'s rules, ε = 1e-3, biases absorbing their share), Integrated Gradients of the same target
logit (zero baseline, Gauss–Legendre), leave-one-out (deletion, p(ŷ|x) − p(ŷ|x∖i)), gradient×input and
attention. Signed maps are compared as they are; the ``|·|`` rows compare magnitudes (Jain & Wallace's reading).
Then it runs :func:`lightning_xai.audits.run_sanity_checks` (Kindermans input invariance, Adebayo cascading
randomisation, IG completeness / LRP conservation) on the first ``--sanity-sentences`` test sentences.

    python examples/lrp_agreement_sst2.py          # ~ a few CPU-minutes
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings

import pytorch_lightning as pl
import torch

from lightning_xai.attribution import attribute
from lightning_xai.audits import run_sanity_checks
from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.metrics.functional import kendall_tau
from lightning_xai.models import AttentionClassifier

MAPS = {
    "LRP": ("lrp", {}),
    "IG (logit)": ("integrated_gradients", {"output": "logit", "n_steps": 32}),
    "LOO": ("leave_one_out", {"signed": True}),
    "grad×input": ("grad_x_input", {}),
    "attention": ("attention", {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--hidden-dim", type=int, default=32)
    parser.add_argument("--embedding-std", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sanity-sentences", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    pl.seed_everything(args.seed, verbose=False)
    dm = TextClassificationDataModule("sst2", batch_size=32, seed=args.seed)
    dm.setup("fit")
    model = AttentionClassifier(
        dm.vocab_size,
        2,
        embedding_dim=args.embedding_dim,
        hidden_dim=args.hidden_dim,
        embedding_std=args.embedding_std,
        vocab=dm.vocab.itos,
    )
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir="/tmp/lightning_xai_lrp_sst2",
    )
    trainer.fit(model, datamodule=dm)
    model.eval()
    dm.setup("test")
    taus = {}
    correct = total = 0
    for batch in dm.test_dataloader():
        with torch.no_grad():
            prediction = model(batch).logits.argmax(-1)
        correct += int((prediction == batch["labels"]).sum())
        total += len(prediction)
        mask = batch["mask"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            maps = {
                name: attribute(model, batch, method, target=prediction, **options)
                for name, (method, options) in MAPS.items()
            }
        for a, b in itertools.combinations(MAPS, 2):
            for kind, transform in (("signed", lambda t: t), ("|·|", torch.abs)):
                if kind == "|·|" and "attention" in (a, b):
                    continue
                tau, _ = kendall_tau(transform(maps[a]), transform(maps[b]), mask)
                taus.setdefault((a, b, kind), []).append(tau)
    print(f"SST-2 test accuracy {correct / total:.3f} ({total} sentences), {time.perf_counter() - started:.0f} s")
    print("| maps | values | Kendall τ-b mean | std | sentences |")
    print("|---|---|---|---|---|")
    for (a, b, kind), parts in taus.items():
        values = torch.cat(parts).double()
        values = values[~values.isnan()]
        print(f"| {a} vs {b} | {kind} | {values.mean():.3f} | {values.std():.3f} | {values.numel()} |")
    test = dm.dataset("test")
    batch = collate([test[i] for i in range(min(args.sanity_sentences, len(test)))])
    for table in run_sanity_checks(model, batch).values():
        print(f"\n{table}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
