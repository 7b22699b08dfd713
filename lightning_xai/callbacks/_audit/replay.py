"""One pass for an audit's prediction and its checked override scorer (:class:`SharedReplay`)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from lightning_xai.adapters.capabilities import OverrideScorer, head_kind_of
from lightning_xai.adapters.protocol import ExplainableModel, ExplainOutput
from lightning_xai.attribution.heads import default_output
from lightning_xai.attribution.override_replay import override_scorer
from lightning_xai.callbacks._audit.results import AuditPrediction

__all__ = ["SharedReplay"]

Replay = Tuple[ExplainOutput, Optional[OverrideScorer]]


class SharedReplay:
    """Mixin of the audits that score attention overrides of every audited batch (``ErasureAudit``'s decision flip,
    ``AttentionBaselines``): the prediction step and :func:`~lightning_xai.attribution.override_replay.override_scorer`
    are the same forward pass (``forward_from_embeddings(embed(batch), batch)``), so :meth:`predict` makes the scorer
    and reads the prediction from its pass, and :meth:`replay_for` hands that scorer to ``audit_batch`` of the same
    batch object (once; any other batch gets ``None`` and makes its own). The scorer is checked as always.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> shared = SharedReplay()
        >>> prediction, replay = shared.replayed_prediction(model, batch)
        >>> shared.replay_for(batch) is replay, shared.replay_for(batch)
        (True, None)
    """

    _kept: Optional[Tuple[Dict[str, Any], Replay]] = None

    def replayed_prediction(self, model: ExplainableModel, batch: Dict[str, Any]) -> Tuple[AuditPrediction, Replay]:
        """The prediction step's result and the batch's checked override scorer, from one pass (kept for
        :meth:`replay_for`)."""
        with torch.no_grad():
            replay = override_scorer(model, model.embed(batch), batch)
        self._kept = (batch, replay)
        return AuditPrediction.from_output(replay[0], head_kind_of(model), default_output(model)), replay

    def replay_for(self, batch: Dict[str, Any]) -> Optional[Replay]:
        """The scorer :meth:`replayed_prediction` made for this very batch object, or ``None``; forgotten either way."""
        kept, self._kept = self._kept, None
        return kept[1] if kept is not None and kept[0] is batch else None
