"""Wiegreffe & Pinter's model-consistent adversary on SST-2, and Jain & Wallace's per-instance search.

    OMP_NUM_THREADS=1 python examples/adversary_sst2.py            # ~10 min on one CPU core

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
import sys
import time
from pathlib import Path
from typing import Any, Dict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import losses_common as C  # noqa: E402

from lightning_xai.audits.adversarial import (adversarial_attention_search, jensen_shannon_divergence,  # noqa: E402
                                              kl_divergence, summarize_search, total_variation)
from lightning_xai.losses import ModelConsistentAdversary  # noqa: E402
from lightning_xai.models import AttentionClassifier  # noqa: E402


class AdversaryClassifier(AttentionClassifier):
    """The adversary: the reference model trained on its adversarial objective alone (a user's own module)."""

    def training_step(self, batch, batch_idx):
        outputs = self(batch)
        loss = self.objectives[0](outputs, batch, model=self)  # TVD − λ·KL against the frozen base
        self.log("train/loss", loss, batch_size=outputs.logits.shape[0])
        return loss


def train_adversary(dm, base: AttentionClassifier, lam: float, epochs: int, seed: int = 0,
                    freeze_encoder: bool = False) -> AdversaryClassifier:
    tag = f"sst2_adversary_lam{lam:g}_ep{epochs}" + ("_frozen" if freeze_encoder else "")
    path = C.RUNS / f"{tag}.pt"
    frozen = copy.deepcopy(base)
    adversary = AdversaryClassifier(dm.vocab_size, dm.num_classes, vocab=dm.vocab.itos, attention="tanh",
                                    objectives=[ModelConsistentAdversary(frozen, lam=lam)], **C.MODEL_KWARGS)
    if path.exists():
        adversary.load_state_dict(torch.load(path, map_location="cpu"))
        print(f"[{tag}] loaded cached weights")
        return adversary.eval()
    adversary.load_state_dict(base.state_dict())  # start from the base's checkpoint ...
    torch.manual_seed(seed)
    for module in adversary.attention.modules():  # ... with a fresh attention scorer
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    if freeze_encoder:  # keep the base's embeddings and BiLSTM: only attention and output layer move
        for p in [*adversary.embedding.parameters(), *adversary.encoder.parameters()]:
            p.requires_grad_(False)
    info = C.fit(adversary, C.loader(dm, "train", shuffle=True, seed=seed), C.loader(dm, "val"), epochs, seed,
                 select_best=False)
    print(f"[{tag}] trained {epochs} epochs in {info['seconds']:.0f}s")
    torch.save(adversary.state_dict(), path)
    return adversary.eval()


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
    return {"jsd": jsd_t.mean().item(), "jsd_median": jsd_t.median().item(), "kl": kl_t.mean().item(),
            "tvd": tvd_t.mean().item(), "tvd_median": tvd_t.median().item(),
            "frac_tvd_le_0.05": (tvd_t <= 0.05).double().mean().item(),
            "acc_adversary": acc_adv / n, "acc_base": acc_base / n, "n": n}


def search(base, dm, limit, steps) -> Dict[str, Any]:
    found = []
    start = time.time()
    for batch in C.loader(dm, "test", limit=limit, batch_size=64):
        found.append(adversarial_attention_search(base, batch, steps=steps, seed=0).max_jsd)
    max_jsd = torch.cat(found)
    summary = summarize_search(max_jsd, threshold=0.3)
    summary["seconds"] = time.time() - start
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lam", type=float, nargs="+", default=[0.05])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--search-limit", type=int, default=None, help="test sentences for the J&W search")
    parser.add_argument("--search-steps", type=int, default=500)
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--skip-adversary", action="store_true", help="only run the per-instance search")
    parser.add_argument("--configs", nargs="*", default=None,
                        help="several adversaries: 'lam,epochs' or 'lam,epochs,frozen' (overrides --lam/--epochs)")
    parser.add_argument("--freeze-encoder", action="store_true",
                        help="train only the adversary's attention scorer and output layer")
    args = parser.parse_args(argv)
    C.setup_threads()
    dm = C.datamodule("sst2")
    base = C.sst2_base(dm)
    test = list(C.loader(dm, "test"))
    configs = [(lam, args.epochs, args.freeze_encoder) for lam in args.lam]
    if args.configs:
        configs = [(float(c.split(",")[0]), int(c.split(",")[1]), c.endswith(",frozen")) for c in args.configs]
    if args.skip_adversary:
        configs = []
    rows = []
    for lam, epochs, frozen in configs:
        adversary = train_adversary(dm, base, lam, epochs, freeze_encoder=frozen)
        r = compare(adversary, base, test)
        print(f"lambda={lam} epochs={epochs} frozen={frozen}: {r}")
        rows.append([f"{lam:g}", epochs, "frozen" if frozen else "trained", r["jsd"], r["jsd_median"], r["kl"],
                     r["tvd"], r["tvd_median"], r["frac_tvd_le_0.05"], r["acc_base"], r["acc_adversary"]])
    text = [] if not rows else ["### Model-consistent adversary (Wiegreffe & Pinter) on SST-2", "",
            f"Base: BiLSTM + tanh attention (test accuracy {rows[0][9]:.3f}). Adversary: the base's weights with a "
            "fresh attention scorer, trained on TVD(ŷ_adv, ŷ_base) − λ·KL(α_adv‖α_base) only (no gold labels); "
            "'encoder' says whether its embeddings and BiLSTM were trained or kept frozen at the base's. "
            f"Test set ({len(dm.dataset('test'))} sentences). JSD in nats (max ln 2 = 0.693).", "",
            C.markdown_table(["λ", "epochs", "encoder", "mean JSD", "median JSD", "mean KL", "mean TVD", "median TVD",
                              "share TVD ≤ 0.05", "base acc", "adversary acc"], rows), "",
            "Command: `OMP_NUM_THREADS=1 python examples/adversary_sst2.py " + " ".join(argv or sys.argv[1:]) + "`"]
    if not args.skip_search:
        s = search(base, dm, args.search_limit, args.search_steps)
        print("search:", s)
        n = int(s["count"])
        search_text = ["### Per-instance adversarial attention search (Jain & Wallace) on SST-2", "",
                 f"The SST-2 base model (BiLSTM + tanh attention), {n} test sentences" + ("" if args.search_limit is None else " (first of the test split)")
                 + f", K=5 candidates, {args.search_steps} Adam steps (lr 0.01, amsgrad), keep |Δŷ| ≤ 0.05. "
                 f"{s['seconds']:.0f} s wall time on one thread.", "",
                 C.markdown_table(["found (Δŷ ≤ 0.05)", "JSD ≥ 0.3", "mean", "q10", "q25", "median", "q75", "q90"],
                                  [[s["fraction_found"], s["fraction_at_least_threshold"], s.get("mean", float("nan")),
                                    s.get("q10", float("nan")), s.get("q25", float("nan")), s.get("median", float("nan")),
                                    s.get("q75", float("nan")), s.get("q90", float("nan"))]]), "",
                       "Command: `OMP_NUM_THREADS=1 python examples/adversary_sst2.py " + " ".join(argv or sys.argv[1:])
                       + "`"]
        C.write_section("adversarial_search_sst2", "\n".join(search_text))
    if rows:
        C.write_section("adversary_sst2", "\n".join(text))


if __name__ == "__main__":
    main()
