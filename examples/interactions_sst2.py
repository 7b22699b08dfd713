"""Integrated Hessians on SST-2: which token pairs does the reference BiLSTM use *together*?

    python examples/interactions_sst2.py               # writes examples/interactions_sst2.png and prints top pairs

Trains the small reference BiLSTM (32-d embeddings, 16 units per direction, tanh attention) for 2 epochs, picks
the first ``--sentences`` test sentences containing a negation ("not", "n't", "no", "never") of 6–14 tokens, and
computes Γ = :func:`~lightning_xai.attribution.integrated_hessians` (probability of the predicted class, zero
baseline). Prints each sentence's completeness error max_s \\|Σ_t Γ_st − IG_s\\| / Σ_s \\|IG_s\\| and its strongest
off-diagonal pairs, and draws Γ as heatmaps (diagonal = main effects, off-diagonal = interactions).
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402

from lightning_xai.attribution import integrated_hessians  # noqa: E402
from lightning_xai.data import TextClassificationDataModule, collate  # noqa: E402
from lightning_xai.models import AttentionClassifier  # noqa: E402

NEGATIONS = {"not", "n't", "no", "never"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--n-steps", type=int, default=16)
    parser.add_argument("--out", default="examples/interactions_sst2.png")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dm = TextClassificationDataModule("sst2", batch_size=32, seed=0)
    dm.setup("fit")
    pl.seed_everything(0, verbose=False)
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=32, hidden_dim=16, embedding_std=0.3)
    pl.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        num_sanity_val_steps=0,
    ).fit(model, datamodule=dm)
    model = model.double().eval()
    test = dm.dataset("test")
    chosen = [
        i for i in range(len(test)) if 6 <= len(dm.tokens("test", i)) <= 14 and NEGATIONS & set(dm.tokens("test", i))
    ][: args.sentences]
    figure, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 4.2))
    for axis, index in zip(list(axes) if len(chosen) > 1 else [axes], chosen):
        batch = collate([test[index]])
        words = dm.tokens("test", index)
        gamma, delta = integrated_hessians(model, batch, n_steps=args.n_steps, return_convergence_delta=True)
        gamma, delta = gamma[0], delta[0]
        ig = gamma.sum(-1) - delta
        error = float(delta.abs().max() / ig.abs().sum())
        off = gamma - torch.diag(torch.diagonal(gamma))
        pairs = sorted(
            ((float(off[s, t] + off[t, s]), s, t) for s in range(len(words)) for t in range(s + 1, len(words))),
            key=lambda x: -abs(x[0]),
        )[:3]
        print(f"[{index}] {' '.join(words)}  (completeness error {error:.1e})")
        for value, s, t in pairs:
            print(f"    {words[s]!r} x {words[t]!r}: Γ_st + Γ_ts = {value:+.4f}")
        limit = float(gamma.abs().max())
        axis.imshow(gamma.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit)
        axis.set_xticks(range(len(words)), words, rotation=90, fontsize=8)
        axis.set_yticks(range(len(words)), words, fontsize=8)
        axis.set_title(f"test #{index}", fontsize=9)
    figure.suptitle("Integrated Hessians Γ (SST-2, BiLSTM + tanh attention)")
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
