"""Optional capabilities a model may add to the :class:`~lightning_xai.adapters.ExplainableModel` protocol.

Each is a small ``runtime_checkable`` protocol: code in the generic layers (attribution, audits) asks
``isinstance(model, Capability)`` and never the model's class, so any model — a reference model, an adapter,
your own module — gains a fast path or a check by implementing the methods. None is required: without one,
leave-one-out re-runs the shortened rows, the adversarial search re-runs the model from its embeddings, the
input-invariance check and LRP report that the model is not supported.

* :class:`DeletionLogits` — score "row ``r`` without token ``p``" variants faster than re-running them
  (leave-one-out's fast path; the reference BiLSTM reuses its recurrent states).
* :class:`HeadKind` — what the logits are scores of: ``"softmax"`` (one class of ``C``, the default of a model
  without it), ``"sigmoid"`` (independent labels, multi-label) or ``"regression"`` (output values, no classes);
  read with :func:`head_kind_of` by every score, prediction and target function.
* :class:`EmbeddingShift` — shift every input embedding by a constant vector and compensate it inside, so
  the model computes the same function (Kindermans et al.'s input-invariance check).
* :class:`LinearHead` — the logits are an affine map of the attention-pooled hidden states, ``head(Σ_t α_t h_t)``
  (the adversarial search's fixed-hidden-state path; LRP's classifier rule; decision flip's replay).
* :class:`OverrideReplay` — score many ``attention_override`` variants of a batch's rows reusing everything
  computed before the point where the override acts (decision flip's fast path;
  :class:`~lightning_xai.adapters.HuggingFaceAdapter` runs only the last layer and the head).
* :class:`PackingScorer` — a scorer of overrides that scores all the overrides of one row of a call together (the
  row computed once, about one position per override), so callers give it all of a row's overrides at once
  (:func:`packs_overrides`).
* :class:`TargetSequence` — the model explains *generation*: the explained output is a target token sequence
  (``batch["labels"]``, -100 where nothing is explained), its maps cover the source/prompt tokens, and its output's
  ``target_log_probs`` are the explained scores (:mod:`lightning_xai.attribution.targets`);
  :class:`~lightning_xai.adapters.HuggingFaceAdapter` over a ``*ForCausalLM`` or an encoder–decoder has it.
* :class:`StepPasses` — a generator builds the passes of its per-step maps itself: one copy of a row per explained
  step, cut to what the step reads (:class:`~lightning_xai.adapters.HuggingFaceAdapter`'s generators: the decoder
  positions up to the step, the LM head at the step's query row only).
* :class:`TokenEncoder` — the hidden states are ``encoder(embeddings, input_mask)``, one module whose type has an
  LRP rule registered with :func:`~lightning_xai.attribution.lrp.register_lrp_encoder` (the models package
  registers the rules of its encoders when it is imported).

And one flag, read by :func:`supports_attention_override`: a model that cannot take ``attention_override`` says so
with ``overridable = False`` (:class:`~lightning_xai.adapters.HuggingFaceAdapter` over a family that computes
attention in its own modeling file and that it cannot hook, e.g. DeBERTa v1), so the audits that replace attention
refuse it at setup.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Protocol, Sequence, Tuple, runtime_checkable

from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput

__all__ = [
    "DeletionLogits",
    "EmbeddingShift",
    "HEAD_KINDS",
    "HeadKind",
    "LinearHead",
    "OverrideReplay",
    "OverrideScorer",
    "PackingScorer",
    "ReferenceLogits",
    "StepPasses",
    "TargetSequence",
    "TokenEncoder",
    "head_kind_of",
    "packs_overrides",
    "supports_attention_override",
    "target_keys",
]

#: ``scorer(rows, attention_override) -> [N, C]`` logits of rows ``rows`` (``LongTensor[N]``) of a batch under an
#: override (``None``: the model's own attention); see :class:`OverrideReplay`.
OverrideScorer = Callable[[Tensor, Optional[Tensor]], Tensor]


#: what a model's ``[B, C]`` logits are scores of (:class:`HeadKind`): one class of C under a softmax, C independent
#: labels under a sigmoid each (multi-label), or C output values (regression)
HEAD_KINDS = ("softmax", "sigmoid", "regression")


@runtime_checkable
class HeadKind(Protocol):
    """A model that says what its logits are: ``head_kind`` is one of :data:`HEAD_KINDS`.

    A model without it is a softmax classifier (what every reference model is).
    :class:`~lightning_xai.adapters.HuggingFaceAdapter` reads ``config.problem_type`` and ``config.num_labels``
    the way ``transformers`` chooses its loss: ``"regression"`` (or no problem type and one label) is
    ``"regression"``, ``"multi_label_classification"`` is ``"sigmoid"``, anything else ``"softmax"``.

    Example:
        >>> from torch import nn
        >>> class Scorer(nn.Linear):
        ...     head_kind = "regression"
        >>> isinstance(Scorer(2, 1), HeadKind), isinstance(nn.Linear(2, 1), HeadKind)
        (True, False)
    """

    @property
    def head_kind(self) -> str:
        """``"softmax"``, ``"sigmoid"`` or ``"regression"``."""
        ...


def head_kind_of(model: object) -> str:
    """The model's :class:`HeadKind` (``"softmax"`` when it does not say), checked against :data:`HEAD_KINDS`.

    Example:
        >>> from torch import nn
        >>> head_kind_of(nn.Linear(2, 2))
        'softmax'
        >>> class Odd(nn.Module):
        ...     head_kind = "ordinal"
        >>> head_kind_of(Odd())
        Traceback (most recent call last):
        ...
        ValueError: Odd.head_kind is 'ordinal'; expected one of ['softmax', 'sigmoid', 'regression'].
    """
    kind = getattr(model, "head_kind", "softmax")
    if kind not in HEAD_KINDS:
        raise ValueError(f"{type(model).__name__}.head_kind is {kind!r}; expected one of {list(HEAD_KINDS)}.")
    return kind


@runtime_checkable
class DeletionLogits(Protocol):
    """Leave-one-out's fast path: the logits of many single-token deletions at once.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=10, num_classes=2, embedding_dim=4, hidden_dim=2).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> with torch.no_grad():  # row 0 without token 1, and row 0 without token 2
        ...     model.deletion_logits(model.embed(batch), batch, torch.tensor([0, 0]), torch.tensor([1, 2])).shape
        torch.Size([2, 2])
    """

    def deletion_logits(self, embeddings: Tensor, batch: Batch, rows: Tensor, positions: Tensor) -> Optional[Tensor]:
        """``[N, C]`` logits of row ``rows[k]`` of the batch with its token ``positions[k]`` deleted.

        ``embeddings`` are ``embed(batch)``. The result must equal running the model on the shortened rows (up
        to float rounding); ``None`` declines (then the caller re-runs the shortened rows).
        """
        ...


@runtime_checkable
class EmbeddingShift(Protocol):
    """A model whose input embeddings can be shifted by a constant without changing its function.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=10, num_classes=2, embedding_dim=4, hidden_dim=2, encoder="cnn")
        >>> isinstance(model, EmbeddingShift), model.embedding_table().shape  # the CNN refuses a shift when asked
        (True, torch.Size([10, 4]))
    """

    def embedding_table(self) -> Tensor:
        """``[V, E]`` the table the input embeddings are looked up in (read, not modified)."""
        ...

    def shift_embeddings(self, shift: Tensor) -> None:
        """In place: add ``shift`` (``[E]``) to every row of the table and compensate it in the first layer
        (``b ← b − W·shift``), so the logits do not change.

        Raises:
            ValueError: the model cannot compensate a shift (e.g. a zero-padded convolution reads the inputs).
        """
        ...


@runtime_checkable
class LinearHead(Protocol):
    """A model whose logits are ``linear_head()(Σ_t α_t h_t)``, with ``α`` its ``attention`` and ``h`` its
    ``hidden_states`` (both from ``forward_from_embeddings``).

    Example:
        >>> from torch import nn
        >>> class Pooled(nn.Module):
        ...     def linear_head(self):
        ...         return nn.Linear(8, 3)
        >>> isinstance(Pooled(), LinearHead), isinstance(nn.Linear(8, 3), LinearHead)
        (True, False)
    """

    def linear_head(self) -> nn.Linear:
        """The ``nn.Linear`` from the pooled context ``[..., H]`` to the logits ``[..., C]``."""
        ...


@runtime_checkable
class OverrideReplay(Protocol):
    """Score many attention overrides of one batch without re-running what an override cannot change.

    :class:`~lightning_xai.adapters.HuggingFaceAdapter` has it (every layer before the last is replayed from one
    recorded pass, :mod:`lightning_xai.adapters.huggingface.replay`); a model with a :class:`LinearHead` needs none (the
    pooling and the head are the whole of what an override changes).

    Example:
        >>> from torch import nn
        >>> class Replaying(nn.Module):
        ...     def override_replay(self, embeddings, batch):
        ...         return self.forward_from_embeddings(embeddings, batch), None  # None: declines
        >>> isinstance(Replaying(), OverrideReplay), isinstance(nn.Linear(2, 2), OverrideReplay)
        (True, False)
    """

    def override_replay(self, embeddings: Tensor, batch: Batch) -> Tuple[ExplainOutput, Optional[OverrideScorer]]:
        """``(forward_from_embeddings(embeddings, batch), scorer)``, the pass run once with what the scorer reuses
        recorded.

        ``scorer(rows, override)`` must equal ``forward_from_embeddings(embeddings[rows], <rows of batch>,
        attention_override=override).logits`` up to float rounding (``override=None``: no override). A ``None``
        scorer declines (then the caller re-runs the model for every override). Callers check a scorer against
        full passes before they trust it (:func:`~lightning_xai.attribution.override_replay.override_scorer`).
        """
        ...


@runtime_checkable
class PackingScorer(Protocol):
    """An :data:`OverrideScorer` that scores the overrides of one row of a call together.

    It lays a row out once per call and adds about one position per override of that row
    (:mod:`~lightning_xai.adapters.huggingface.packing`: copies of the pooled query appended to the row), so
    ``scorer(rows, override)`` costs about the row plus one position per override, and the same overrides spread
    over several calls cost the row once per call. A caller that has many overrides of a row (every step of a
    decision flip, every permutation of a permutation test) gives them in one call; the scorer sizes its passes to
    its own memory budget. ``packs_rows`` says whether it does (:func:`packs_overrides`).

    Example:
        >>> class Packed:
        ...     packs_rows = True
        ...     def __call__(self, rows, override):
        ...         ...
        >>> isinstance(Packed(), PackingScorer), isinstance(lambda rows, override: None, PackingScorer)
        (True, False)
    """

    packs_rows: bool

    def __call__(self, rows: Tensor, override: Optional[Tensor]) -> Tensor:
        """The ``[N, C]`` logits of ``rows`` under ``override``, as :data:`OverrideScorer`."""
        ...


def packs_overrides(scorer: Optional[OverrideScorer]) -> bool:
    """Whether ``scorer`` scores the overrides of a row together (a :class:`PackingScorer` whose ``packs_rows`` is
    True): then a caller gives it all of a row's overrides in one call.

    Example:
        >>> packs_overrides(None), packs_overrides(lambda rows, override: rows)
        (False, False)
    """
    return isinstance(scorer, PackingScorer) and scorer.packs_rows is True


@runtime_checkable
class TargetSequence(Protocol):
    """A model whose explained output is a target token sequence (generation), not a class.

    The batch carries the target as ``labels`` (transformers' convention: -100 where nothing is explained). Every
    explanation is over the source tokens (``token_mask``: the prompt of a causal LM, the encoder input of an
    encoder–decoder) and explains ``ExplainOutput.target_log_probs``: by default their sum, the log-probability of
    the whole target; ``target=k`` the ``k``-th target token's (see :mod:`lightning_xai.attribution.targets`).

    Example:
        >>> from torch import nn
        >>> class Generator(nn.Module):
        ...     def target_positions(self, batch):
        ...         return batch["labels"] != -100
        ...     def target_keys(self, batch):
        ...         return ()
        ...     def greedy_targets(self, batch, max_new_tokens=20):
        ...         return batch
        >>> isinstance(Generator(), TargetSequence), isinstance(nn.Linear(2, 2), TargetSequence)
        (True, False)
    """

    def target_positions(self, batch: Batch) -> Tensor:
        """``[B, S]`` bool: the positions of ``batch["labels"]`` that are explained (target tokens)."""
        ...

    def target_keys(self, batch: Batch) -> Tuple[str, ...]:
        """The batch keys indexed by target step rather than by input token: ``()`` for a causal LM (its labels are
        aligned with ``input_ids`` and shift with them when a token is deleted), ``("labels", ...)`` for an
        encoder–decoder, whose target must stay as it is when source tokens are deleted or trimmed."""
        ...

    def greedy_targets(self, batch: Batch, max_new_tokens: int = 20) -> Batch:
        """ "Free decoding": ``batch`` with its target replaced by the model's own greedy output (each row's source or
        prompt kept, up to ``max_new_tokens`` tokens generated, the end-of-sequence token included)."""
        ...


@runtime_checkable
class StepPasses(Protocol):
    """A generator (:class:`TargetSequence`) that builds the passes of its per-step maps itself.

    :func:`~lightning_xai.callbacks._audit.generation.method_step_maps` explains every ``(row, step)`` pair; without
    this capability each pair is a whole copy of its row with a per-row step target. With it the model gives the
    passes: ``(rows, ranks, batch, target)`` tuples, copy ``i`` of ``batch`` explaining step ``ranks[i]`` of row
    ``rows[i]`` as its own step ``target[i]``, with the same map (up to float summation order) over its first
    columns (the columns a copy drops are 0 in the row's map).

    Example:
        >>> from torch import nn
        >>> class Generator(nn.Module):
        ...     def step_passes(self, batch, wanted, tokens_per_pass):
        ...         return []
        >>> isinstance(Generator(), StepPasses), isinstance(nn.Linear(2, 2), StepPasses)
        (True, False)
    """

    def step_passes(
        self, batch: Batch, wanted: Tensor, tokens_per_pass: int
    ) -> Sequence[Tuple[Tensor, Tensor, Dict[str, Any], Tensor]]:
        """The passes explaining every pair where ``wanted`` (``[B, K]`` bool) is true, each pair once, in passes of
        at most ``tokens_per_pass`` padded tokens."""
        ...


def target_keys(model: object, batch: Batch) -> Tuple[str, ...]:
    """The keys of ``batch`` that batch surgery must leave as they are (:meth:`TargetSequence.target_keys`; ``()``
    for any other model).

    Example:
        >>> from torch import nn
        >>> target_keys(nn.Linear(2, 2), {"labels": None})
        ()
    """
    return tuple(model.target_keys(batch)) if isinstance(model, TargetSequence) else ()


@runtime_checkable
class TokenEncoder(Protocol):
    """A model whose ``hidden_states`` are ``token_encoder()(embeddings, input_mask(batch))``.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> type(AttentionClassifier(vocab_size=10, num_classes=2, encoder="mlp").token_encoder()).__name__
        'MLPEncoder'
    """

    def token_encoder(self) -> nn.Module:
        """The module from input embeddings ``[B, T, E]`` and the input mask to hidden states ``[B, T, H]``."""
        ...

    def input_mask(self, batch: Batch) -> Tensor:
        """``[B, T]`` bool: the positions the encoder reads (real tokens and special ones like ``<sos>``)."""
        ...


def supports_attention_override(model: object) -> bool:
    """Whether ``forward_from_embeddings(..., attention_override=...)`` is expected to work: False only when the
    model declares ``overridable = False``.

    Example:
        >>> from torch import nn
        >>> supports_attention_override(nn.Linear(2, 2))
        True
        >>> class Fixed(nn.Module):
        ...     overridable = False
        >>> supports_attention_override(Fixed())
        False
    """
    return bool(getattr(model, "overridable", True))


@runtime_checkable
class ReferenceLogits(Protocol):
    """An adapter of a user's module that can run that module the way its user does, so the adapter's logits can
    be checked against the module's own (:func:`~lightning_xai.adapters.checks.check_logits`).

    :class:`~lightning_xai.adapters.HuggingFaceAdapter` has it (the model's own ``forward`` on ``input_ids``; the
    PEFT model's when there is one). A model that is its own reference needs none.

    Example:
        >>> from torch import nn
        >>> class Wrapping(nn.Module):
        ...     def reference_logits(self, batch):
        ...         return batch["logits"]
        ...     def describe_reference(self):
        ...         return "Net", "check the wrapper's options"
        >>> isinstance(Wrapping(), ReferenceLogits), isinstance(nn.Linear(2, 2), ReferenceLogits)
        (True, False)
    """

    def reference_logits(self, batch: Batch) -> Tensor:
        """``[B, C]``: the user's module's own logits on ``batch`` (run as its user runs it)."""
        ...

    def describe_reference(self) -> Tuple[str, str]:
        """``(name of the user's module, how to fix a mismatch)`` for the error message."""
        ...
