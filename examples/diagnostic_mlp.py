"""Wiegreffe & Pinter's diagnostic MLP and seed variance on SST-2.

    OMP_NUM_THREADS=1 python examples/diagnostic_mlp.py --epochs 4 --seeds 1 --adversary-config \
        lam=0.005,epochs=4,frozen,init=sst2_adversary_lam0.1_ep2_frozen,select=dev,checks=4,lr=5e-4

A context-free MLP (per-token embedding → Linear(E, 128) → tanh, pooled by attention, then linear) is trained
four times on SST-2 with: its own trained attention, uniform attention, the audited BiLSTM's attention imposed
(frozen), and the model-consistent adversary's attention imposed (from examples/adversary_sst2.py, same
options; trained first if not cached). If the BiLSTM's attention carries token-level information, imposing it
helps the MLP more than the adversary's attention does. Seed variance: BiLSTMs retrained with other seeds,
JSD of their attention to the base's on the test set (the yardstick for the adversary's JSD).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import adversary_sst2 as A  # noqa: E402
import losses_common as C  # noqa: E402

from lightning_xai.audits.seed_variance import seed_variance  # noqa: E402
from lightning_xai.models.diagnostic import diagnostic_audit  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lam", type=float, default=0.01)
    parser.add_argument("--adversary-epochs", type=int, default=2)
    parser.add_argument("--freeze-encoder", action="store_true")
    parser.add_argument(
        "--adversary-config",
        default=None,
        help="the adversary as in adversary_sst2.py --configs, e.g. "
        "'lam=0.1,epochs=4,frozen,drop=0.3,select=dev,checks=4' (overrides the three above)",
    )
    parser.add_argument("--epochs", type=int, default=5, help="epochs of each diagnostic MLP")
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--seed-epochs", type=int, default=4)
    args = parser.parse_args(argv)
    C.setup_threads()
    dm = C.datamodule("sst2")
    base = C.sst2_base(dm)
    defaults = {
        "lam": args.lam,
        "epochs": args.adversary_epochs,
        "freeze_encoder": args.freeze_encoder,
        "lr": 1e-3,
        "select": "last",
        "init": None,
        "checks": 1,
        "min_dev_jsd": 0.45,
        "drop": 0.0,
    }
    config = A.parse_config(args.adversary_config, defaults) if args.adversary_config else defaults
    adversary = A.train_adversary(dm, base, **config)
    described = (
        f"λ = {config['lam']:g}, {config['epochs']} epochs"
        + (", embeddings/BiLSTM frozen" if config["freeze_encoder"] else "")
        + (f", word dropout {config['drop']:g}" if config["drop"] else "")
        + (f", from {config['init']}" if config["init"] else "")
        + (", selected on dev mean TVD" if config["select"] == "dev" else "")
    )
    results = diagnostic_audit(
        C.loader(dm, "train", shuffle=True),
        C.loader(dm, "val"),
        C.loader(dm, "test"),
        dm.vocab_size,
        dm.num_classes,
        {"base": base, "adversary": adversary},
        epochs=args.epochs,
        embedding_dim=C.MODEL_KWARGS["embedding_dim"],
        embedding_std=C.MODEL_KWARGS["embedding_std"],
        trainer_kwargs={"accelerator": "cpu", "default_root_dir": str(C.RUNS / "trainer")},
    )
    print(results)
    names = {
        "trained": "trained MLP attention",
        "uniform": "uniform",
        "imposed:base": "imposed: base BiLSTM attention",
        "imposed:adversary": "imposed: adversary attention",
    }
    rows = [[names[k], v["acc"], v["f1"]] for k, v in results.items()]
    text = [
        "### Diagnostic MLP (Wiegreffe & Pinter) on SST-2",
        "",
        f"Context-free MLP (embedding {C.MODEL_KWARGS['embedding_dim']} → Linear(·, 128) → tanh → attention pooling "
        f"→ linear), {args.epochs} epochs, best dev accuracy, seed 0. Adversary (examples/adversary_sst2.py): "
        f"{described}. SST-2 test split.",
        "",
        C.markdown_table(["attention", "test acc", "test macro-F1"], rows),
    ]
    if args.seeds:
        others = [
            C.cached_classifier(
                f"sst2_seed{s}_ep{args.seed_epochs}", dm, epochs=args.seed_epochs, seed=s, attention="tanh"
            )
            for s in args.seeds
        ]
        test = list(C.loader(dm, "test"))
        sv = seed_variance(base, others, test).summary()
        adv = seed_variance(base, [adversary], test).summary()
        print("seed variance", sv, "adversary", adv)
        text += [
            "",
            f"Seed variance: BiLSTMs retrained with seeds {args.seeds} ({args.seed_epochs} epochs) vs the "
            "base, test split.",
            "",
            C.markdown_table(
                ["compared with the base", "mean JSD(α, α_base)", "median JSD", "mean TVD(ŷ, ŷ_base)"],
                [
                    ["other seeds", sv["mean_jsd"], sv["median_jsd"], sv["mean_tvd"]],
                    ["adversary", adv["mean_jsd"], adv["median_jsd"], adv["mean_tvd"]],
                ],
            ),
        ]
    text += [
        "",
        "Command: `OMP_NUM_THREADS=1 python examples/diagnostic_mlp.py " + " ".join(argv or sys.argv[1:]) + "`",
    ]
    C.write_section("diagnostic_mlp", "\n".join(text))


if __name__ == "__main__":
    main()
