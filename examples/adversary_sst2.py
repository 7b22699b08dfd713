"""Wiegreffe & Pinter's model-consistent adversary on SST-2, and Jain & Wallace's per-instance search.

    OMP_NUM_THREADS=1 python examples/adversary_sst2.py            # ~10 min on one CPU core

    # the recipe that meets JSD >= 0.4 with mean TVD <= 0.05 on test (two stages, frozen encoder, dev selection):
    OMP_NUM_THREADS=1 python examples/adversary_sst2.py --skip-search --configs 0.1,2,frozen \
        lam=0.005,epochs=4,frozen,init=sst2_adversary_lam0.1_ep2_frozen,select=dev,checks=4,lr=5e-4

1. The audited base model: BiLSTM (64/direction) + tanh attention, 8 epochs, best dev accuracy (cached in
   runs/losses_examples/sst2_base.pt; shared with the other loss examples).
2. The adversary starts from the base's weights with its attention scorer re-initialised (a copy of the base
   has KL = 0 and zero gradient, so it would never move), and trains on L = TVD(ŷ_adv, ŷ_base) −
   λ·KL(α_adv ‖ α_base) only — no cross-entropy on gold labels: it follows the frozen base.
3. On the test set: mean JSD / KL between the two attentions, mean TVD between the predictions, accuracy.
4. Jain & Wallace's per-instance search (K=5, 500 Adam steps) on the test sentences: distribution of the
   max JSD found within |Δŷ| ≤ 0.05.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import losses_common as C  # noqa: E402

from lightning_xai.audits.adversarial import (
    adversarial_attention_search,
    jensen_shannon_divergence,  # noqa: E402
    kl_divergence,
    summarize_search,
    total_variation,
)
from lightning_xai.losses import ModelConsistentAdversary  # noqa: E402
from lightning_xai.models import AttentionClassifier  # noqa: E402


class AdversaryClassifier(AttentionClassifier):
    """The adversary: the reference model trained on its adversarial objective alone (a user's own module).

    Validation also logs ``val/adv_jsd`` and ``val/adv_tvd`` (dev means of JSD(α_adv, α_base) and
    TVD(ŷ_adv, ŷ_base)), the quantities checkpoint selection reads.
    """

    word_dropout: float = 0.0  # > 0: also train on a copy of each batch with this share of its words removed
    _generator = None

    def training_step(self, batch, batch_idx):
        if self.word_dropout > 0:
            if self._generator is None:
                self._generator = torch.Generator().manual_seed(0)
            batch = with_dropped_words(batch, self.word_dropout, self._generator)
        outputs = self(batch)
        loss = self.objectives[0](outputs, batch, model=self)  # TVD − λ·KL against the frozen base
        self.log("train/loss", loss, batch_size=outputs.logits.shape[0])
        return loss

    def log_evaluation_extras(self, outputs, batch, stage, batch_size):
        base = self.objectives[0].base_outputs(batch, outputs.logits.device)
        jsd = jensen_shannon_divergence(outputs.attention, base.attention).mean()
        tvd = total_variation(outputs.logits.softmax(-1), base.logits.softmax(-1)).mean()
        self.log(f"{stage}/adv_jsd", jsd, batch_size=batch_size)
        self.log(f"{stage}/adv_tvd", tvd, batch_size=batch_size)


def with_dropped_words(batch: Dict[str, Any], p: float, generator: torch.Generator) -> Dict[str, Any]:
    """The batch followed by a copy of it with each word removed with probability ``p`` (at least one word of
    each sentence kept; the kept words close up, in order). Unlabelled augmentation: the adversary learns to
    follow the base also where the base is less sure — as it often is on unseen sentences — than on the
    training sentences it has fitted."""
    mask = batch["mask"]
    keep = mask & (torch.rand(mask.shape, generator=generator) >= p)
    empty = ~keep.any(-1)
    keep[empty] = mask[empty]
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
    kept = keep.gather(1, order)
    dropped = {"input_ids": batch["input_ids"].gather(1, order) * kept, "mask": kept}
    out = dict(batch)
    out["input_ids"] = torch.cat([batch["input_ids"], dropped["input_ids"]])
    out["mask"] = torch.cat([mask, kept])
    for key in ("labels", "index"):
        if key in batch:
            out[key] = torch.cat([batch[key], batch[key]])
    return out


class DevSelection(pl.Callback):
    """Keep the weights of the validation check with the lowest dev mean TVD among those whose dev mean JSD is
    at least ``min_jsd`` (the dev split only; the test split is never looked at)."""

    def __init__(self, min_jsd: float) -> None:
        self.min_jsd = min_jsd
        self.best_tvd = float("inf")
        self.state = None
        self.chosen = None
        self.history = []

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        jsd = float(trainer.callback_metrics["val/adv_jsd"])
        tvd = float(trainer.callback_metrics["val/adv_tvd"])
        point = {"epoch": trainer.current_epoch, "step": trainer.global_step, "dev_jsd": jsd, "dev_tvd": tvd}
        self.history.append(point)
        print(f"  dev check {point}")
        if jsd >= self.min_jsd and tvd < self.best_tvd:
            self.best_tvd, self.chosen = tvd, point
            self.state = copy.deepcopy(pl_module.state_dict())


def adversary_tag(
    lam: float,
    epochs: int,
    freeze_encoder: bool = False,
    lr: float = 1e-3,
    select: str = "last",
    init: Optional[str] = None,
    checks: int = 1,
    drop: float = 0.0,
    min_dev_jsd: float = 0.45,
) -> str:
    tag = f"sst2_adversary_lam{lam:g}_ep{epochs}" + ("_frozen" if freeze_encoder else "")
    if drop:
        tag += f"_drop{drop:g}"
    if lr != 1e-3:
        tag += f"_lr{lr:g}"
    if select != "last":
        tag += f"_sel{select}{checks}" + ("" if min_dev_jsd == 0.45 else f"_jsd{min_dev_jsd:g}")
    if init is not None:
        tag += f"_from-{init}"
    return tag


def train_adversary(
    dm,
    base: AttentionClassifier,
    lam: float,
    epochs: int,
    seed: int = 0,
    freeze_encoder: bool = False,
    lr: float = 1e-3,
    select: str = "last",
    init: Optional[str] = None,
    checks: int = 1,
    min_dev_jsd: float = 0.45,
    drop: float = 0.0,
) -> AdversaryClassifier:
    """Train (or load the cached) adversary.

    Args:
        lam: λ of the objective.
        epochs: training epochs (over the SST-2 train split, no gold labels).
        freeze_encoder: keep the base's embeddings and BiLSTM; only the attention scorer and output layer move.
        lr: Adam learning rate.
        select: ``"last"`` keeps the final weights; ``"dev"`` keeps the validation check with the lowest dev
            mean TVD among those with dev mean JSD ≥ ``min_dev_jsd``.
        init: tag of a cached adversary to continue from (a second stage, e.g. with a smaller λ) instead of
            the base with a fresh attention scorer.
        checks: validation checks per epoch (for ``select="dev"``).
        drop: word-dropout augmentation: each training batch is followed by a copy with this share of its words
            removed (:func:`with_dropped_words`); 0 trains on the sentences as they are.
    """
    tag = adversary_tag(lam, epochs, freeze_encoder, lr, select, init, checks, drop, min_dev_jsd)
    path = C.RUNS / f"{tag}.pt"
    frozen = copy.deepcopy(base)
    adversary = AdversaryClassifier(
        dm.vocab_size,
        dm.num_classes,
        vocab=dm.vocab.itos,
        attention="tanh",
        lr=lr,
        objectives=[ModelConsistentAdversary(frozen, weight=lam)],
        **C.MODEL_KWARGS,
    )
    if path.exists():
        adversary.load_state_dict(torch.load(path, map_location="cpu"))
        print(f"[{tag}] loaded cached weights")
        return adversary.eval()
    if init is None:
        adversary.load_state_dict(base.state_dict())  # start from the base's checkpoint ...
        torch.manual_seed(seed)
        for module in adversary.attention.modules():  # ... with a fresh attention scorer
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    else:
        adversary.load_state_dict(torch.load(C.RUNS / f"{init}.pt", map_location="cpu"))
    adversary.word_dropout = drop
    if freeze_encoder:  # keep the base's embeddings and BiLSTM: only attention and output layer move
        for p in [*adversary.embedding.parameters(), *adversary.encoder.parameters()]:
            p.requires_grad_(False)
    selection = DevSelection(min_dev_jsd)
    train = C.loader(dm, "train", shuffle=True, seed=seed)
    info = C.fit(
        adversary,
        train,
        C.loader(dm, "val"),
        epochs,
        seed,
        select_best=False,
        callbacks=[selection],
        trainer_kwargs={"val_check_interval": max(1, len(train) // checks)} if checks > 1 else None,
    )
    print(f"[{tag}] trained {epochs} epochs in {info['seconds']:.0f}s")
    if select == "dev":
        if selection.state is None:
            raise RuntimeError(
                f"[{tag}] no validation check reached dev mean JSD >= {min_dev_jsd}; history: {selection.history}"
            )
        adversary.load_state_dict(selection.state)
        print(f"[{tag}] selected on dev: {selection.chosen}")
    torch.save(adversary.state_dict(), path)
    (C.RUNS / f"{tag}.history.json").write_text(
        json.dumps({"history": selection.history, "chosen": selection.chosen if select == "dev" else None})
    )
    return adversary.eval()


def parse_config(text: str, defaults: Dict[str, Any]) -> Dict[str, Any]:
    """``'0.1,2,frozen'`` (λ, epochs[, frozen]) or ``'lam=0.1,epochs=6,frozen,lr=5e-4,select=dev,checks=4,
    init=<tag>'``."""
    config = dict(defaults)
    positional = ["lam", "epochs"]
    for part in text.split(","):
        if part == "frozen":
            config["freeze_encoder"] = True
        elif "=" in part:
            key, value = part.split("=", 1)
            config[key] = value
        else:
            config[positional.pop(0)] = part
    kinds = {
        "lam": float,
        "epochs": int,
        "lr": float,
        "checks": int,
        "min_dev_jsd": float,
        "select": str,
        "init": str,
        "freeze_encoder": bool,
        "drop": float,
    }
    unknown = set(config) - set(kinds)
    if unknown:
        raise ValueError(f"unknown adversary option(s) {sorted(unknown)} in {text!r}; use {sorted(kinds)}.")
    return {k: kinds[k](v) if v is not None and k != "freeze_encoder" else v for k, v in config.items()}


@torch.no_grad()
def compare(adversary, base, batches) -> Dict[str, float]:
    jsd, kl, tvd, acc_adv, acc_base, n = [], [], [], 0, 0, 0
    for batch in batches:
        a, b = adversary(batch), base(batch)
        jsd.append(jensen_shannon_divergence(a.attention, b.attention))
        kl.append(kl_divergence(a.attention, b.attention))
        tvd.append(total_variation(a.logits.softmax(-1), b.logits.softmax(-1)))
        acc_adv += int((a.logits.argmax(-1) == batch["labels"]).sum())
        acc_base += int((b.logits.argmax(-1) == batch["labels"]).sum())
        n += len(batch["labels"])
    jsd_t, kl_t, tvd_t = torch.cat(jsd), torch.cat(kl), torch.cat(tvd)
    return {
        "jsd": jsd_t.mean().item(),
        "jsd_median": jsd_t.median().item(),
        "kl": kl_t.mean().item(),
        "tvd": tvd_t.mean().item(),
        "tvd_median": tvd_t.median().item(),
        "frac_tvd_le_0.05": (tvd_t <= 0.05).double().mean().item(),
        "acc_adversary": acc_adv / n,
        "acc_base": acc_base / n,
        "n": n,
    }


def search(base, dm, limit, steps) -> Dict[str, Any]:
    found = []
    start = time.time()
    for batch in C.loader(dm, "test", limit=limit, batch_size=64):
        found.append(adversarial_attention_search(base, batch, steps=steps, seed=0).max_jsd)
    max_jsd = torch.cat(found)
    summary = summarize_search(max_jsd, threshold=0.3)
    summary["seconds"] = time.time() - start
    return summary


SEARCH_CALLBACK_NOTE = (
    "While a model trains, `lightning_xai.callbacks.AdversarialSearchAudit(steps=..., num_samples=..., "
    "every_n_epochs=...)` runs this search on a fixed audit subset at validation end and logs the same distribution "
    "(`adversarial_search/fraction_found`, `fraction_jsd_at_least_threshold`, `jsd/mean`, `jsd/q10` … `jsd/q90`, "
    "`output_change/mean`) to the trainer's loggers."
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lam", type=float, nargs="+", default=[0.05])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--search-limit", type=int, default=None, help="test sentences for the J&W search")
    parser.add_argument("--search-steps", type=int, default=500)
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--skip-adversary", action="store_true", help="only run the per-instance search")
    parser.add_argument(
        "--configs",
        nargs="*",
        default=None,
        help="several adversaries: 'lam,epochs' or 'lam,epochs,frozen' (overrides --lam/--epochs)",
    )
    parser.add_argument(
        "--freeze-encoder", action="store_true", help="train only the adversary's attention scorer and output layer"
    )
    args = parser.parse_args(argv)
    C.setup_threads()
    dm = C.datamodule("sst2")
    base = C.sst2_base(dm)
    test = list(C.loader(dm, "test"))
    defaults = {
        "epochs": args.epochs,
        "freeze_encoder": args.freeze_encoder,
        "lr": 1e-3,
        "select": "last",
        "init": None,
        "checks": 1,
        "min_dev_jsd": 0.45,
        "drop": 0.0,
    }
    configs = [dict(defaults, lam=lam) for lam in args.lam]
    if args.configs:
        configs = [parse_config(c, defaults) for c in args.configs]
    if args.skip_adversary:
        configs = []
    rows = []
    dev = list(C.loader(dm, "val"))
    for config in configs:
        adversary = train_adversary(dm, base, **config)
        r, d = compare(adversary, base, test), compare(adversary, base, dev)
        print(f"{config}: test {r} dev {d}")
        recipe = "frozen" if config["freeze_encoder"] else "trained"
        if config["lr"] != 1e-3:
            recipe += f", lr {config['lr']:g}"
        if config["drop"]:
            recipe += f", word dropout {config['drop']:g}"
        if config["init"] is not None:
            recipe += f", from {config['init'].replace('sst2_adversary_', '')}"
        selection = (
            "last" if config["select"] == "last" else f"dev ({config['checks']}/epoch, JSD ≥ {config['min_dev_jsd']:g})"
        )
        rows.append(
            [
                f"{config['lam']:g}",
                config["epochs"],
                recipe,
                selection,
                d["jsd"],
                f"{d['tvd']:.4f}",
                r["jsd"],
                r["jsd_median"],
                r["kl"],
                f"{r['tvd']:.4f}",
                r["tvd_median"],
                r["frac_tvd_le_0.05"],
                r["acc_base"],
                r["acc_adversary"],
            ]
        )
    text = (
        []
        if not rows
        else [
            "### Model-consistent adversary (Wiegreffe & Pinter) on SST-2",
            "",
            f"Base: BiLSTM + tanh attention (test accuracy {rows[0][12]:.3f}). Adversary: the base's weights with a "
            "fresh attention scorer, trained on TVD(ŷ_adv, ŷ_base) − λ·KL(α_adv‖α_base) only (no gold labels); "
            "'recipe' says whether its embeddings and BiLSTM were trained or kept frozen at the base's, the "
            "learning rate when not 1e-3, and the adversary it continued from (a second stage); 'selection' is "
            "the last weights or the dev check with the lowest dev mean TVD among those with dev mean JSD above "
            "the bar (dev split, 872 sentences; the test split is never used to choose). "
            f"Test set ({len(dm.dataset('test'))} sentences). JSD in nats (max ln 2 = 0.693).",
            "",
            C.markdown_table(
                [
                    "λ",
                    "epochs",
                    "recipe",
                    "selection",
                    "dev JSD",
                    "dev TVD",
                    "mean JSD",
                    "median JSD",
                    "mean KL",
                    "mean TVD",
                    "median TVD",
                    "share TVD ≤ 0.05",
                    "base acc",
                    "adversary acc",
                ],
                rows,
            ),
            "",
            "Command: `OMP_NUM_THREADS=1 python examples/adversary_sst2.py " + " ".join(argv or sys.argv[1:]) + "`",
        ]
    )
    if not args.skip_search:
        s = search(base, dm, args.search_limit, args.search_steps)
        print("search:", s)
        n = int(s["count"])
        search_text = [
            "### Per-instance adversarial attention search (Jain & Wallace) on SST-2",
            "",
            f"The SST-2 base model (BiLSTM + tanh attention), {n} test sentences"
            + ("" if args.search_limit is None else " (first of the test split)")
            + f", K=5 candidates, {args.search_steps} Adam steps (lr 0.01, amsgrad), keep |Δŷ| ≤ 0.05. "
            f"{s['seconds']:.0f} s wall time on one thread.",
            "",
            C.markdown_table(
                ["found (Δŷ ≤ 0.05)", "JSD ≥ 0.3", "mean", "q10", "q25", "median", "q75", "q90"],
                [
                    [
                        s["fraction_found"],
                        s["fraction_at_least_threshold"],
                        s.get("mean", float("nan")),
                        s.get("q10", float("nan")),
                        s.get("q25", float("nan")),
                        s.get("median", float("nan")),
                        s.get("q75", float("nan")),
                        s.get("q90", float("nan")),
                    ]
                ],
            ),
            "",
            "Command: `OMP_NUM_THREADS=1 python examples/adversary_sst2.py " + " ".join(argv or sys.argv[1:]) + "`",
            "",
            SEARCH_CALLBACK_NOTE,
        ]
        C.write_section("adversarial_search_sst2", "\n".join(search_text))
    if rows:
        C.write_section("adversary_sst2", "\n".join(text))


if __name__ == "__main__":
    main()
