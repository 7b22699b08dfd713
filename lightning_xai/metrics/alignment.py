"""Word-alignment quality as a torchmetrics ``Metric``: Och & Ney's AER with link precision, recall and F1.

``update(pred, sure, possible=None)`` takes a corpus of links (see
:mod:`~lightning_xai.metrics.functional.alignment`); the states are the four link counts, reduced with
``dist_reduce_fx="sum"``, so the DDP-synced value is the corpus-level value over the union of the data.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_xai.metrics.functional.alignment import CorpusLinks, alignment_counts, alignment_scores_from_counts

__all__ = ["AlignmentErrorRate"]


class AlignmentErrorRate(Metric):
    """Corpus-level alignment error rate (Och & Ney 2003) of predicted links A against sure S and possible P links.

    AER = 1 − (|A ∩ S| + |A ∩ P|) / (|A| + |S|); precision = |A ∩ P| / |A|; recall = |A ∩ S| / |S|;
    F1 = 2·P·R / (P + R). The counts are summed over every sentence seen before dividing (the standard corpus
    AER, not a mean of sentence AERs). ``possible=None`` means P = S, and then AER = 1 − F1; a ``possible`` corpus
    not containing S is taken as P ∪ S. Nothing predicted gives AER 1 (1 − 0/|S|) and precision 0; with no link
    predicted and no sure link at all, ``compute()`` warns and returns NaN.

    ``compute()`` → ``{"aer", "precision", "recall", "f1", "sentences"}``. ``higher_is_better`` is False: it
    refers to ``aer``, the metric's name.

    Example:
        >>> metric = AlignmentErrorRate()
        >>> metric.update([[(0, 0), (1, 1)]], sure=[[(0, 0), (1, 2)]], possible=[[(1, 1)]])
        >>> pred, sure = torch.tensor([[[True, False], [False, False]]]), torch.tensor([[[True, False], [False, True]]])
        >>> metric.update(pred, sure)  # one more sentence, as bool [B, S, T] matrices
        >>> {k: round(float(v), 4) for k, v in metric.compute().items()}  # |A|=3, |S|=4, |A∩S|=2, |A∩P|=3
        {'aer': 0.2857, 'precision': 1.0, 'recall': 0.5, 'f1': 0.6667, 'sentences': 2.0}
    """

    is_differentiable = False
    higher_is_better: Optional[bool] = False
    full_state_update = False

    predicted: Tensor
    sure: Tensor
    predicted_sure: Tensor
    predicted_possible: Tensor
    sentences: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in ("predicted", "sure", "predicted_sure", "predicted_possible", "sentences"):
            self.add_state(name, default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: CorpusLinks, sure: CorpusLinks, possible: Optional[CorpusLinks] = None) -> None:
        counts = alignment_counts(pred, sure, possible)
        self.predicted += counts.predicted.sum().to(self.predicted.device)
        self.sure += counts.sure.sum().to(self.sure.device)
        self.predicted_sure += counts.predicted_sure.sum().to(self.predicted_sure.device)
        self.predicted_possible += counts.predicted_possible.sum().to(self.predicted_possible.device)
        self.sentences += counts.predicted.numel()

    def compute(self) -> Dict[str, Tensor]:
        if int(self.predicted) + int(self.sure) == 0:
            warnings.warn(
                "AlignmentErrorRate: no predicted and no sure link was seen, so the scores are undefined (NaN).",
                UserWarning,
                stacklevel=2,
            )
        out = alignment_scores_from_counts(self.predicted, self.sure, self.predicted_sure, self.predicted_possible)
        out["sentences"] = self.sentences.double()
        return out
