"""Wiegreffe & Pinter's seed variance: how far attention moves between models that differ only in the seed.

An adversary's attention divergence is only meaningful next to this baseline: if retraining with another seed
already moves attention by JSD 0.3 at equal predictions, an adversary reaching 0.3 shows little.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Sequence

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel, as_explainable
from lightning_xai.attribution.heads import check_softmax_head
from lightning_xai.metrics.functional.divergence import jensen_shannon_divergence, total_variation

__all__ = ["SeedVarianceResult", "attention_divergence", "seed_variance"]


@dataclass
class SeedVarianceResult:
    """Per-instance divergences of each compared model from the base.

    Attributes:
        jsd: ``[M, N]`` JSD(α_m, α_base) per model and instance.
        tvd: ``[M, N]`` TVD(ŷ_m, ŷ_base) per model and instance.
    """

    jsd: Tensor
    tvd: Tensor

    def summary(self) -> Dict[str, float]:
        """Means and medians over all models and instances."""
        return {
            "mean_jsd": self.jsd.mean().item(),
            "median_jsd": self.jsd.median().item(),
            "mean_tvd": self.tvd.mean().item(),
            "median_tvd": self.tvd.median().item(),
        }


@torch.no_grad()
def attention_divergence(
    model: ExplainableModel, base: ExplainableModel, batches: Iterable[Batch]
) -> Dict[str, Tensor]:
    """Per-instance JSD(α_model, α_base) and TVD(ŷ_model, ŷ_base) over ``batches`` (both in eval mode).

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> a = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> attention_divergence(a, a, [batch])["jsd"]
        tensor([0.])
    """
    model, base = as_explainable(model), as_explainable(base)
    for one in (model, base):
        check_softmax_head(one, "attention_divergence")
    modes = [(m, m.training) for m in (model, base) if isinstance(m, torch.nn.Module)]
    for m, _ in modes:
        m.eval()
    jsd: List[Tensor] = []
    tvd: List[Tensor] = []
    try:
        for batch in batches:
            out = model.forward_from_embeddings(model.embed(batch), batch)
            ref = base.forward_from_embeddings(base.embed(batch), batch)
            if out.attention.shape != ref.attention.shape:
                raise ValueError(
                    f"attention shapes differ: {tuple(out.attention.shape)} vs "
                    f"{tuple(ref.attention.shape)}; the models must read the same tokens."
                )
            jsd.append(jensen_shannon_divergence(out.attention, ref.attention).cpu())
            tvd.append(total_variation(out.logits.softmax(-1), ref.logits.softmax(-1)).cpu())
    finally:
        for m, was_training in modes:
            m.train(was_training)
    return {"jsd": torch.cat(jsd), "tvd": torch.cat(tvd)}


def seed_variance(
    base: ExplainableModel, others: Sequence[ExplainableModel], batches: Iterable[Batch]
) -> SeedVarianceResult:
    """JSD of attention and TVD of predictions of each model in ``others`` (e.g. other seeds) to ``base``.

    ``batches`` is iterated once per model, so pass a re-iterable (a DataLoader or a list).

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> models = [AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4) for _ in "ab"]
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> seed_variance(models[0], models[1:], [batch]).jsd.shape
        torch.Size([1, 1])
    """
    if not others:
        raise ValueError("seed_variance needs at least one model to compare with the base.")
    parts: List[Dict[str, Any]] = [attention_divergence(m, base, batches) for m in others]
    return SeedVarianceResult(jsd=torch.stack([p["jsd"] for p in parts]), tvd=torch.stack([p["tvd"] for p in parts]))
