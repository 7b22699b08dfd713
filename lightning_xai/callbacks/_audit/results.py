"""What an audit produces: the typed result of one audited batch, the typed per-example result (with the strongest
token pairs of :mod:`~lightning_xai.callbacks._audit.pairs` kept for the report), the outcome of one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_xai.attribution.targets import score_values
from lightning_xai.callbacks._audit.generation import row_steps
from lightning_xai.callbacks._audit.pairs import DEFAULT_TOP_PAIRS, TokenPairs, strongest_pairs
from lightning_xai.data.vocabulary import token_list

__all__ = [
    "AuditExample",
    "AuditPrediction",
    "AuditResult",
    "BatchResult",
    "TokenPairs",
    "collect_examples",
    "example_tokens",
]


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What :meth:`~lightning_xai.callbacks.AuditCallback.audit_batch` measured on one batch of the audit subset
    (``B`` rows, ``T`` tokens wide); every tensor has one row per example of the batch.

    An ``audit_batch`` fills :attr:`maps` and :attr:`values` (and :attr:`interactions` for an interaction method);
    the base class adds :attr:`prediction` and :attr:`probability` from the shared prediction step (unless the
    audit set them) and :attr:`undefined` for rows without a defined result, then turns the rows into
    :class:`AuditExample` s.

    Attributes:
        maps: per-map token scores ``{name: [B, T]}`` (e.g. ``"attention"``, ``"gradient"``), kept over the real
            tokens for the examples a report shows (``num_report_examples``).
        values: per-example scalars ``{name: [B]}``, averaged into the logged metrics; ``name/p_value`` holds the
            p-values of ``name`` (its ``significant_fraction``).
        prediction: ``[B]`` predicted class (``None``: the shared prediction step's): the argmax class, a
            multi-label model's highest-scoring label, -1 for a regression model or a generator (no class).
        probability: ``[B]`` probability of the predicted class (``None``: the shared prediction step's): its
            softmax probability, the sigmoid of a multi-label model's predicted label, a regression model's output
            value (no probability), a generator's probability of its target (see :class:`AuditPrediction`).
        undefined: ``{row: cause}`` of the rows whose results are undefined (e.g. ``"non-finite logits"``); their
            values are NaN and every aggregate leaves them out. Set by the base class.
        interactions: ``[B, T, T]`` token-pair interactions Γ of an interaction method (Integrated Hessians), or
            ``None``; each shown example keeps its :attr:`interaction_pairs` strongest pairs (:class:`TokenPairs`).
        interaction_pairs: how many pairs of :attr:`interactions` a shown example keeps.
        interaction_method: the attribution method :attr:`interactions` come from (its record returns
            ``"pairwise_interactions"``).
        step_maps: a generator's per-step maps ``{name: [B, K, T]}``: attention's row of each target step and each
            method's map of that step's log-probability (``attribute(..., target="steps")``), for the rows a report
            shows; a shown example keeps them over its real tokens (:attr:`AuditExample.step_maps`).
        step_mask: ``[B, K]`` bool: the target steps :attr:`step_maps` hold (no step for the rows not shown).

    Example:
        >>> result = BatchResult(maps={"attention": torch.tensor([[0.7, 0.3]])}, values={"v": torch.tensor([0.5])})
        >>> result.values["v"].tolist(), result.prediction is None, result.undefined
        ([0.5], True, {})
    """

    maps: Mapping[str, Tensor] = field(default_factory=dict)
    values: Mapping[str, Tensor] = field(default_factory=dict)
    prediction: Optional[Tensor] = None
    probability: Optional[Tensor] = None
    undefined: Mapping[int, str] = field(default_factory=dict)
    interactions: Optional[Tensor] = None
    interaction_pairs: int = DEFAULT_TOP_PAIRS
    interaction_method: str = "integrated_hessians"
    step_maps: Mapping[str, Tensor] = field(default_factory=dict)
    step_mask: Optional[Tensor] = None


@dataclass
class AuditExample:
    """One audited example, as the reports show it.

    Attributes:
        position: position in the audit subset (the order every process agrees on).
        index: index of the example in its split (``dataset[index]``).
        split: ``"train"``, ``"val"`` or ``"test"``.
        token_ids: ids of the real tokens (``batch["mask"]`` positions), in order.
        label: gold class (``None`` if the batch has no labels).
        prediction: predicted class (-1: none, for a regression model or a generator; see
            :class:`AuditPrediction`).
        probability: probability of the predicted class (a regression model's output value; see
            :class:`AuditPrediction`).
        maps: per-method token scores over the real tokens (same length as ``token_ids``).
        values: per-example scalar results, e.g. ``{"kendall_tau/attention~gradient": 0.31}``.
        tokens: the words (filled by :meth:`AuditCallback.example_tokens`; ``None`` until then).
        undefined: why the example's results are undefined (e.g. ``"non-finite logits"``), ``None`` when they are
            defined. Its values are NaN and every aggregate leaves it out (it counts neither as "not flipped" nor as
            a wrong prediction).
        interactions: the strongest token pairs of an interaction method (Integrated Hessians' Γ), kept for
            the report's examples only; ``None`` otherwise.
        target_token_ids: a generator's explained target tokens (``labels`` ``!= -100``, in order: one per target
            step), kept with :attr:`step_maps` for the report's examples only; ``None`` otherwise.
        target_tokens: the words of :attr:`target_token_ids` (filled by :meth:`AuditCallback.example_tokens` with
            ``target=True``; ``None`` until then).
        step_maps: a generator's per-step maps, source tokens × target steps: ``step_maps[name][k][i]`` is map
            ``name``'s score of real token ``i`` (of :attr:`token_ids`) for target step ``k`` (of
            :attr:`target_token_ids`) — attention's row of step ``k`` and each method's map of ``log p(y_k | y_<k,
            source)``. Kept for the report's examples only (``{}`` otherwise).

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
    target_token_ids: Optional[List[int]] = None
    target_tokens: Optional[List[str]] = None
    step_maps: Dict[str, List[List[float]]] = field(default_factory=dict)


@dataclass
class AuditPrediction:
    """The model's prediction on an audited batch: computed once by the base class, handed to ``audit_batch``.

    The logits are read through the model's head (:func:`~lightning_xai.adapters.capabilities.head_kind_of`) by
    :func:`~lightning_xai.attribution.targets.score_values` with the head's default output
    (:func:`~lightning_xai.attribution.heads.default_output`), the score an explanation with ``target=None``
    explains:

    * **softmax** (a classifier): ``probabilities`` the softmax, ``prediction`` the argmax class (the model's
      decision, :func:`~lightning_xai.attribution.heads.decisions`), ``probability`` its probability;
    * **sigmoid** (multi-label): ``probabilities`` each label's sigmoid, ``prediction`` the highest-scoring label
      (the one explained; the decision itself is the set of labels above 0.5), ``probability`` its sigmoid;
    * **regression**: there is no class and no probability: ``probabilities`` are the output values, ``prediction``
      is -1 and ``probability`` is the explained output value (the largest, for a model of several outputs).

    For a generator (an output carrying ``target_log_probs``, see
    :class:`~lightning_xai.adapters.capabilities.TargetSequence`) there is no class either: ``probabilities`` are
    the ``[B, K]`` probabilities of the target tokens (0 at steps a row does not have), ``prediction`` is -1 and
    ``probability`` is the probability of the whole target, ``exp Σ_k log p(y_k | y_<k, source)``.

    Attributes:
        output: the protocol's ``forward_from_embeddings`` output (``logits`` ``[B, C]``, ``attention`` ``[B, T]``).
        probabilities: ``[B, C]`` float32 scores of the head (see above; a generator's: ``[B, K]``).
        prediction: ``[B]`` predicted class (-1 for a regression model or a generator).
        probability: ``[B]`` probability of the predicted class (a regression model's: its value; a generator's:
            of its target).

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> p = AuditPrediction.from_output(SimpleNamespace(logits=torch.tensor([[0.0, 2.0]]), attention=None))
        >>> p.prediction.tolist(), round(p.probability.item(), 4)
        ([1], 0.8808)
        >>> p = AuditPrediction.from_output(SimpleNamespace(logits=torch.tensor([[2.5]]), attention=None),
        ...                             "regression", "logit")
        >>> p.prediction.tolist(), p.probability.tolist()
        ([-1], [2.5])
    """

    output: Any
    probabilities: Tensor
    prediction: Tensor
    probability: Tensor

    @classmethod
    def from_output(cls, output: Any, head: str = "softmax", score: str = "probability") -> "AuditPrediction":
        """The scores, prediction and probability of ``output.logits`` under a ``head``, ``score`` being the
        head's default output (``"logit"`` for a regression head; see the class docstring)."""
        log_probs = getattr(output, "target_log_probs", None)
        if log_probs is not None:
            steps = output.target_steps.to(log_probs.device)
            per_step = log_probs.detach().float().masked_fill(~steps, 0.0)
            return cls(
                output=output,
                probabilities=per_step.exp().masked_fill(~steps, 0.0),
                prediction=torch.full(steps.shape[:1], -1, dtype=torch.long, device=steps.device),
                probability=per_step.sum(-1).exp(),
            )
        probabilities = score_values(output.logits.detach().float(), score, head)
        top = probabilities.max(-1)  # the argmax class (decisions), a multi-label model's top label, the value
        prediction = torch.full_like(top.indices, -1) if head == "regression" else top.indices
        return cls(output=output, probabilities=probabilities, prediction=prediction, probability=top.values)

    @property
    def finite(self) -> Tensor:
        """``[B]`` bool: the rows whose logits are all finite (a generator's: whose target log-probabilities are);
        the others' results are undefined."""
        log_probs = getattr(self.output, "target_log_probs", None)
        if log_probs is not None:
            steps = self.output.target_steps.to(log_probs.device)
            return (torch.isfinite(log_probs.detach()) | ~steps).all(-1)
        return torch.isfinite(self.output.logits.detach()).all(-1)

    @property
    def attention(self) -> Tensor:
        """The model's attention ``[B, T]``, detached, float32."""
        return self.output.attention.detach().float()


@dataclass
class AuditResult:
    """The outcome of one audit run: aggregated scalars plus per-example detail.

    ``explained_quantity`` says in words what the audit's maps and scores explain (e.g. ``"regression output
    value"``, :func:`~lightning_xai.attribution.heads.explained_quantity`), for audits that explain a score;
    its record (the :attr:`AuditCallback.history` entry) then holds it too.

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
    explained_quantity: Optional[str] = None

    def record(self) -> Dict[str, Any]:
        """The checkpointable summary kept in :attr:`AuditCallback.history`."""
        record = {
            "run": self.run,
            "stage": self.stage,
            "epoch": self.epoch,
            "global_step": self.global_step,
            "split": self.split,
            "num_examples": len(self.examples),
            "metrics": dict(self.metrics),
        }
        if self.explained_quantity is not None:  # only when known: the records of other audits keep their keys
            record["explained_quantity"] = self.explained_quantity
        return record


def collect_examples(
    mask: Tensor,
    batch: Mapping[str, Any],
    positions: Sequence[int],
    indices: Sequence[int],
    split: str,
    found: BatchResult,
    num_report_examples: int,
) -> List[AuditExample]:
    """One :class:`AuditExample` per row of an audited batch.

    Args:
        mask: ``[B, T]`` real-token mask of the batch.
        batch: the batch (``input_ids`` and ``labels`` are read when present; ``labels`` only as ``[B]`` classes).
        positions / indices: the rows' positions in the audit subset and their dataset indices.
        split: the audited split.
        found: the batch's :class:`BatchResult`, its ``prediction`` and ``probability`` set.
        num_report_examples: rows whose position is below it keep their maps (and strongest pairs).

    Example:
        >>> found = BatchResult(prediction=torch.tensor([1]), probability=torch.tensor([0.75]),
        ...                     maps={"attention": torch.tensor([[0.6, 0.4, 0.0]])}, values={"v": torch.tensor([0.5])})
        >>> e, = collect_examples(torch.tensor([[True, True, False]]), {"input_ids": torch.tensor([[3, 4, 0]])},
        ...                       [0], [9], "val", found, num_report_examples=1)
        >>> e.token_ids, e.maps["attention"], e.values
        ([3, 4], [0.6000000238418579, 0.4000000059604645], {'v': 0.5})
    """
    if found.prediction is None or found.probability is None:
        raise ValueError("collect_examples needs the prediction and probability of every row of the batch.")
    mask = mask.detach().cpu()
    ids = batch["input_ids"].detach().cpu() if "input_ids" in batch else None
    labels = batch.get("labels")  # a class per row; a generator's [B, S] target sequence is not a label
    labels = (
        labels.detach().cpu().tolist() if isinstance(labels, Tensor) and labels.dim() == 1 else [None] * len(indices)
    )
    pred = found.prediction.detach().cpu().tolist()
    prob = found.probability.detach().float().cpu().tolist()
    maps = {k: v.detach().float().cpu() for k, v in found.maps.items()}
    values = {k: v.detach().double().cpu().tolist() for k, v in found.values.items()}
    gamma = found.interactions.detach().double().cpu() if isinstance(found.interactions, Tensor) else None
    top = int(found.interaction_pairs)
    method = found.interaction_method
    target = batch.get("labels")  # a generator's [B, S] target: the words of the step maps' steps
    steps = found.step_mask.detach().cpu() if found.step_mask is not None and isinstance(target, Tensor) else None
    step_maps = {k: v.detach().float().cpu() for k, v in found.step_maps.items()} if steps is not None else {}
    out = []
    for row, (pos, index) in enumerate(zip(positions, indices)):
        real = mask[row]
        keep_maps = pos < num_report_examples
        undefined = found.undefined.get(row)
        pairs = (
            strongest_pairs(gamma[row][real][:, real], top, method)
            if keep_maps and gamma is not None and undefined is None
            else None
        )
        shown = (
            row_steps(step_maps, steps, target.detach().cpu(), row, real)
            if keep_maps and steps is not None and isinstance(target, Tensor) and undefined is None
            else None
        )
        out.append(
            AuditExample(
                position=pos,
                index=index,
                split=split,
                token_ids=ids[row][real].tolist() if ids is not None else list(range(int(real.sum()))),
                label=labels[row],
                prediction=int(pred[row]),
                probability=float(prob[row]),
                maps={k: v[row][real].tolist() for k, v in maps.items()} if keep_maps else {},
                values={k: float(v[row]) for k, v in values.items()},
                undefined=undefined,
                interactions=pairs,
                target_token_ids=shown[0] if shown else None,
                step_maps=shown[1] if shown else {},
            )
        )
    return out


def _vocabulary(owner: Any) -> Optional[Sequence[str]]:
    try:  # a Vocabulary, a list of words, or a dict id -> token / token -> id (lightning_xai.data.token_list)
        return token_list(getattr(owner, "vocab", None))
    except ValueError as err:
        rank_zero_warn(f"{type(owner).__name__}.vocab cannot name the tokens ({err}); the report shows ids.")
        return None


def example_tokens(
    trainer: Optional["pl.Trainer"], pl_module: Any, example: AuditExample, tokenizer: Any = None, target: bool = False
) -> List[str]:
    """The words of an audited example (``target=True``: of a generator example's target tokens,
    :attr:`AuditExample.target_token_ids`, from sources 2–4), from the first source that knows them:

    1. ``trainer.datamodule.tokens(split, index)`` (one word per real token);
    2. ``tokenizer.convert_ids_to_tokens`` (word pieces), the tokenizer given here — an audit callback passes
       its ``tokenizer=``, else the LightningModule's or DataModule's ``tokenizer`` attribute;
    3. a vocabulary: a ``vocab`` attribute (a list of words, a dict id -> word or word -> id, or a
       :class:`~lightning_xai.data.Vocabulary`; :func:`~lightning_xai.data.vocabulary.token_list`) of
       the LightningModule or the DataModule;
    4. the ids, as strings.

    Example:
        >>> class Module:
        ...     vocab = ["<pad>", "good", "film"]
        >>> example_tokens(None, Module(), AuditExample(0, 0, "val", [1, 2], 1, 1, 0.9))
        ['good', 'film']
    """
    ids = list(example.target_token_ids or []) if target else example.token_ids
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    if not target and datamodule is not None and callable(getattr(datamodule, "tokens", None)):
        try:  # the DataModule's words are the source's (one per real token)
            words = list(datamodule.tokens(example.split, example.index))
            if len(words) == len(ids):
                return [str(w) for w in words]
        except (IndexError, KeyError, ValueError):
            pass
    if callable(getattr(tokenizer, "convert_ids_to_tokens", None)):
        pieces = tokenizer.convert_ids_to_tokens([int(i) for i in ids])
        if len(pieces) == len(ids) and all(p is not None for p in pieces):
            return [str(p) for p in pieces]
    for owner in (pl_module, datamodule):
        vocab = _vocabulary(owner)
        if vocab is not None and all(0 <= i < len(vocab) for i in ids):
            return [str(vocab[i]) for i in ids]
    return [str(i) for i in ids]
