"""Remove-and-retrain on SST-2 with the reference BiLSTM: does attention beat random once every model is retrained?

    python examples/roar_sst2.py                       # attention, gradient, leave-one-out, random; 10..90 %
    python examples/roar_sst2.py --rankings attention random --fractions 0.1 0.5 0.9 --seeds 0 1 2

Ranks every train/val/test token once with the base model, masks the top share of each sentence (``<unk>``),
retrains a fresh model per (ranking, fraction, seed) and reports test accuracy; writes a Markdown table, a JSON
file and a PNG (accuracy vs fraction, one line per ranking) to ``--out``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lightning_xai.data import TextClassificationDataModule  # noqa: E402
from lightning_xai.models import AttentionClassifier  # noqa: E402
from lightning_xai.roar import remove_and_retrain  # noqa: E402
from lightning_xai.roar.cli import build_parser  # noqa: E402


def main() -> None:
    parser = build_parser()  # the options of the ``lightning-xai-roar`` console script
    parser.set_defaults(out="examples/roar_sst2")
    args = parser.parse_args()

    dm = TextClassificationDataModule(args.dataset, batch_size=args.batch_size, seed=0)
    dm.setup("fit")

    def make() -> AttentionClassifier:
        return AttentionClassifier(
            dm.vocab_size, 2, embedding_dim=args.embedding_dim, hidden_dim=args.hidden_dim, embedding_std=0.3
        )

    start = time.time()
    result = remove_and_retrain(
        dm,
        make,
        rankings=args.rankings,
        fractions=args.fractions,
        seeds=args.seeds,
        mode=args.mode,
        trainer_kwargs={"max_epochs": args.epochs, "num_sanity_val_steps": 0},
        method_options={"gradient": {"detach_attention": True}},
        on_result=lambda r, f, s, a: print(f"{r:>15} {f:4.0%} seed {s}: test acc {a:.3f}", flush=True),
    )
    elapsed = time.time() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = result.table()
    print(table)
    print(f"wall time {elapsed:.0f} s")
    payload = {
        "args": vars(args),
        "seconds": elapsed,
        "base_accuracy": result.base_accuracy,
        "accuracy": {r: {str(f): v for f, v in per.items()} for r, per in result.accuracy.items()},
    }
    out.with_suffix(".json").write_text(json.dumps(payload, indent=2))
    out.with_suffix(".md").write_text(table + "\n")
    figure, axis = plt.subplots(figsize=(5, 3.5))
    for name in result.accuracy:
        fractions = [0.0, *sorted(result.accuracy[name])]
        axis.plot(
            [100 * f for f in fractions],
            [result.mean(name, f) for f in fractions],
            marker="o",
            label=name,
            linestyle="--" if name == "random" else "-",
        )
    axis.set_xlabel("tokens masked per sentence (%)")
    axis.set_ylabel("test accuracy after retraining")
    axis.set_title("ROAR on SST-2 (BiLSTM + tanh attention)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
