"""What an audit produces: a typed per-example result and the outcome of one run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import pytorch_lightning as pl
import torch
from torch import Tensor

from lightning_xai.callbacks.interactions import DEFAULT_TOP_PAIRS, TokenPairs, strongest_pairs

__all__ = ["AuditExample", "AuditPrediction", "AuditResult", "collect_examples", "example_tokens"]


@dataclass
class AuditExample:
    """One audited example, as the reports show it.

    Attributes:
        position: position in the audit subset (the order every process agrees on).
        index: index of the example in its split (``dataset[index]``).
        split: ``"train"``, ``"val"`` or ``"test"``.
        token_ids: ids of the real tokens (``batch["mask"]`` positions), in order.
        label: gold class (``None`` if the batch has no labels).
        prediction: predicted class.
        probability: probability of the predicted class.
        maps: per-method token scores over the real tokens (same length as ``token_ids``).
        values: per-example scalar results, e.g. ``{"kendall_tau/attention~gradient": 0.31}``.
        tokens: the words (filled by :meth:`AuditCallback.example_tokens`; ``None`` until then).
        undefined: why the example's results are undefined (e.g. ``"non-finite logits"``), ``None`` when they are
            defined. Its values are NaN and every aggregate leaves it out (it counts neither as "not flipped" nor as
            a wrong prediction).
        interactions: the strongest token pairs of an interaction method (Integrated Hessians' Γ), kept for
            the report's examples only; ``None`` otherwise.

    Example:
        >>> AuditExample(position=0, index=7, split="val", token_ids=[4, 5], label=1, prediction=1,
        ...              probability=0.9).values
        {}
    """

    position: int
    index: int
    split: str
    token_ids: List[int]
    label: Optional[int]
    prediction: int
    probability: float
    maps: Dict[str, List[float]] = field(default_factory=dict)
    values: Dict[str, float] = field(default_factory=dict)
    tokens: Optional[List[str]] = None
    undefined: Optional[str] = None
    interactions: Optional[TokenPairs] = None


@dataclass
class AuditPrediction:
    """The model's prediction on an audited batch: computed once by the base class, handed to ``audit_batch``.

    Attributes:
        output: the protocol's ``forward_from_embeddings`` output (``logits`` ``[B, C]``, ``attention`` ``[B, T]``).
        probabilities: ``[B, C]`` float32 softmax of the logits.
        prediction: ``[B]`` predicted class (argmax).
        probability: ``[B]`` probability of the predicted class.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> p = AuditPrediction.from_output(SimpleNamespace(logits=torch.tensor([[0.0, 2.0]]), attention=None))
        >>> p.prediction.tolist(), round(p.probability.item(), 4)
        ([1], 0.8808)
    """

    output: Any
    probabilities: Tensor
    prediction: Tensor
    probability: Tensor

    @classmethod
    def from_output(cls, output: Any) -> "AuditPrediction":
        """Softmax, argmax and the top probability of ``output.logits``."""
        probabilities = output.logits.detach().float().softmax(-1)
        top = probabilities.max(-1)
        return cls(output=output, probabilities=probabilities, prediction=top.indices, probability=top.values)

    @property
    def finite(self) -> Tensor:
        """``[B]`` bool: the rows whose logits are all finite (the others' results are undefined)."""
        return torch.isfinite(self.output.logits.detach()).all(-1)

    @property
    def attention(self) -> Tensor:
        """The model's attention ``[B, T]``, detached, float32."""
        return self.output.attention.detach().float()


@dataclass
class AuditResult:
    """The outcome of one audit run: aggregated scalars plus per-example detail.

    Example:
        >>> AuditResult("fit", 0, 10, "val", {"m/mean": 0.5}, []).record()["metrics"]
        {'m/mean': 0.5}
    """

    stage: str
    epoch: int
    global_step: int
    split: str
    metrics: Dict[str, float]
    examples: List[AuditExample]
    extras: Dict[str, Any] = field(default_factory=dict)
    #: which Trainer of the callback's life ran it (0: the first; a callback attached to a second Trainer counts on)
    run: int = 0

    def record(self) -> Dict[str, Any]:
        """The checkpointable summary kept in :attr:`AuditCallback.history`."""
        return {"run": self.run, "stage": self.stage, "epoch": self.epoch, "global_step": self.global_step,
                "split": self.split, "num_examples": len(self.examples), "metrics": dict(self.metrics)}


def collect_examples(mask: Tensor, batch: Mapping[str, Any], positions: Sequence[int], indices: Sequence[int],
                     split: str, found: Mapping[str, Any], num_report_examples: int) -> List[AuditExample]:
    """One :class:`AuditExample` per row of an audited batch.

    Args:
        mask: ``[B, T]`` real-token mask of the batch.
        batch: the batch (``input_ids`` and ``labels`` are read when present).
        positions / indices: the rows' positions in the audit subset and their dataset indices.
        split: the audited split.
        found: ``prediction`` ``[B]``, ``probability`` ``[B]``, optional ``maps`` ``{name: [B, T]}``,
            ``values`` ``{name: [B]}``, ``undefined`` ``{row: cause}`` (rows whose results are undefined) and
            ``interactions`` ``[B, T, T]`` (Γ; the ``interaction_pairs`` strongest pairs are kept, default 10) of
            the method ``interaction_method``.
        num_report_examples: rows whose position is below it keep their maps (and strongest pairs).

    Example:
        >>> import torch
        >>> found = {"prediction": torch.tensor([1]), "probability": torch.tensor([0.75]),
        ...          "maps": {"attention": torch.tensor([[0.6, 0.4, 0.0]])}, "values": {"v": torch.tensor([0.5])}}
        >>> e, = collect_examples(torch.tensor([[True, True, False]]), {"input_ids": torch.tensor([[3, 4, 0]])},
        ...                       [0], [9], "val", found, num_report_examples=1)
        >>> e.token_ids, e.maps["attention"], e.values
        ([3, 4], [0.6000000238418579, 0.4000000059604645], {'v': 0.5})
    """
    mask = mask.detach().cpu()
    ids = batch["input_ids"].detach().cpu() if "input_ids" in batch else None
    labels = batch.get("labels")
    labels = labels.detach().cpu().tolist() if isinstance(labels, Tensor) else [None] * len(indices)
    pred = found["prediction"].detach().cpu().tolist()
    prob = found["probability"].detach().float().cpu().tolist()
    maps = {k: v.detach().float().cpu() for k, v in found.get("maps", {}).items()}
    values = {k: v.detach().double().cpu().tolist() for k, v in found.get("values", {}).items()}
    gamma = found.get("interactions")
    gamma = gamma.detach().double().cpu() if isinstance(gamma, Tensor) else None
    top = int(found.get("interaction_pairs", DEFAULT_TOP_PAIRS))
    method = str(found.get("interaction_method", "integrated_hessians"))
    out = []
    for row, (pos, index) in enumerate(zip(positions, indices)):
        real = mask[row]
        keep_maps = pos < num_report_examples
        undefined = found.get("undefined", {}).get(row)
        pairs = (strongest_pairs(gamma[row][real][:, real], top, method)
                 if keep_maps and gamma is not None and undefined is None else None)
        out.append(AuditExample(
            position=pos, index=index, split=split,
            token_ids=ids[row][real].tolist() if ids is not None else list(range(int(real.sum()))),
            label=labels[row], prediction=int(pred[row]), probability=float(prob[row]),
            maps={k: v[row][real].tolist() for k, v in maps.items()} if keep_maps else {},
            values={k: float(v[row]) for k, v in values.items()},
            undefined=undefined, interactions=pairs))
    return out


def _vocabulary(owner: Any) -> Optional[Sequence[str]]:
    vocab = getattr(owner, "vocab", None)
    vocab = getattr(vocab, "itos", vocab)  # a lightning_xai.data.Vocabulary or a list of words
    return vocab if isinstance(vocab, (list, tuple)) else None


def example_tokens(trainer: Optional["pl.Trainer"], pl_module: Any, example: AuditExample,
                   tokenizer: Any = None) -> List[str]:
    """The words of an audited example, from the first source that knows them:

    1. ``trainer.datamodule.tokens(split, index)`` (one word per real token);
    2. ``tokenizer.convert_ids_to_tokens`` (word pieces), the tokenizer given here — an audit callback passes
       its ``tokenizer=``, else the LightningModule's or DataModule's ``tokenizer`` attribute;
    3. a vocabulary: a ``vocab`` attribute (a list of words, or a :class:`~lightning_xai.data.Vocabulary`) of
       the LightningModule or the DataModule;
    4. the ids, as strings.

    Example:
        >>> class Module:
        ...     vocab = ["<pad>", "good", "film"]
        >>> example_tokens(None, Module(), AuditExample(0, 0, "val", [1, 2], 1, 1, 0.9))
        ['good', 'film']
    """
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    if datamodule is not None and callable(getattr(datamodule, "tokens", None)):
        try:
            words = list(datamodule.tokens(example.split, example.index))
            if len(words) == len(example.token_ids):
                return [str(w) for w in words]
        except (IndexError, KeyError, ValueError):
            pass
    if callable(getattr(tokenizer, "convert_ids_to_tokens", None)):
        pieces = tokenizer.convert_ids_to_tokens([int(i) for i in example.token_ids])
        if len(pieces) == len(example.token_ids) and all(p is not None for p in pieces):
            return [str(p) for p in pieces]
    for owner in (pl_module, datamodule):
        vocab = _vocabulary(owner)
        if vocab is not None and all(0 <= i < len(vocab) for i in example.token_ids):
            return [str(vocab[i]) for i in example.token_ids]
    return [str(i) for i in example.token_ids]
