"""See a Hugging Face ``transformers`` sequence classifier through the :class:`ExplainableModel` protocol.

How the protocol maps onto a transformer (BERT family first; nothing below is BERT-specific except the
default position of the summary token):

* ``embed(batch)`` is the model's *input word embedding* of ``batch["input_ids"]`` (``model.get_input_embeddings()``),
  ``[B, T, E]``. Position and token-type embeddings, the embedding LayerNorm and dropout are added *inside* the
  model, which is run with ``inputs_embeds=`` — so a gradient or an Integrated-Gradients path w.r.t. ``embed``'s
  output is exactly Captum's ``LayerIntegratedGradients`` on the word-embedding layer.
* ``forward_from_embeddings`` runs the model with every layer's attention probabilities recorded
  (``raw_attentions``: one ``[B, heads, T, T]`` tensor per layer) and reduces them to one ``[B, T]`` token
  distribution (``attention``; the pass and its reading: :mod:`lightning_xai.adapters.huggingface.classifier_pass`),
  chosen by the ``attention=`` argument:

  the reductions of :mod:`lightning_xai.adapters.huggingface.reductions` (``"cls_last_mean"``, the default:
  the last layer's pooled query row averaged over heads; ``"cls_last_max"``, ``"L:H"``, ``"rollout"``, a callable).

  **Which row.** Every reduction reads the row of the position the classifier pools, found per model and per
  row by :mod:`lightning_xai.adapters.huggingface.pooling` (``[CLS]`` for the BERT family, the last non-pad token for
  decoder classifiers with left or right padding, the mean of rows for mean-pooled heads); ``query_index=``
  overrides it. For causal models "attention" is therefore the last real token's attention over the sentence.
  The pooled positions are reported as ``extras["query_positions"]`` (``LongTensor[B]``, one per row) and
  ``extras["query_mask"]`` (``[B, T]`` bool).

  **Renormalisation over real tokens.** Every reduction is set to 0 on ``[CLS]``, ``[SEP]`` and pads and divided by
  its sum over the real tokens: ``a_i / Σ_{j real} a_j``. This is the distribution of the ``[CLS]`` query's
  attention *conditional on not attending to a special token* (BERT puts much of its mass on ``[SEP]``); it is what
  the metrics compare with saliency maps, which also live on real tokens only. The raw rows (with the special
  tokens' mass) stay available in ``raw_attentions`` and ``extras["cls_rows"]`` (the pooled rows ``[B, heads, T]``,
  the mean of the rows for a mean-pooled head; the name is historical).
* ``attention_override`` replaces the **last layer's pooled query row(s)** of the attention probabilities, for every
  head, before they multiply the values (``[B, T]`` over real tokens, or ``[B, heads, T]`` raw rows; passing
  ``extras["cls_rows"]`` back reproduces the logits bit for bit): the semantics are in
  :mod:`lightning_xai.adapters.huggingface.attention`, which also switches a model to its recording attention
  **only for the adapter's own passes**, so a model loaded with ``sdpa``/flash attention keeps training on it.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.capabilities import OverrideScorer
from lightning_xai.adapters.checks import (
    check_attention_mask,
    check_logits,
    check_sequence_length,
    check_token_ids,
    evaluating,
)
from lightning_xai.adapters.huggingface.attention import (
    ATTENTION_IMPLEMENTATION,
    recording_attention,
    register_attention_implementation,
)
from lightning_xai.adapters.huggingface.classifier_pass import explained_output, run_pass
from lightning_xai.adapters.huggingface.families import module_calls
from lightning_xai.adapters.huggingface.heads import head_kind as config_head_kind
from lightning_xai.adapters.huggingface.inputs import check_tokenizer, position_offset, warn_missing_token_types
from lightning_xai.adapters.huggingface.native import native_attention_modules
from lightning_xai.adapters.huggingface.parts import input_embedding, randomization_stages, recorded_attention_modules
from lightning_xai.adapters.huggingface.pooling import detect_pooling, is_causal, query_mask
from lightning_xai.adapters.huggingface.reductions import Reduction, attention_rollout, parse_reduction
from lightning_xai.adapters.huggingface.replay import override_replay
from lightning_xai.adapters.huggingface.shift import embedding_shift_refusal, shift_input_embeddings
from lightning_xai.adapters.huggingface.tokens import real_token_mask
from lightning_xai.adapters.huggingface.unwrap import unwrap
from lightning_xai.adapters.protocol import Batch, ExplainOutput, ProtocolError
from lightning_xai.adapters.sharding import gathered

__all__ = ["ATTENTION_IMPLEMENTATION", "HuggingFaceAdapter", "attention_rollout", "register_attention_implementation"]


class HuggingFaceAdapter(nn.Module):
    """A ``transformers`` sequence classifier seen through the :class:`ExplainableModel` protocol.

    Batches are dicts with ``input_ids`` and ``attention_mask`` ``[B, T]`` (plus ``token_type_ids`` if the model
    uses them) and optionally ``mask``: True at real word-pieces (not ``[CLS]``/``[SEP]``/pad) — what
    :class:`lightning_xai.data.hf.WordPieceCollator` produces. Without ``mask`` the token mask is
    ``attention_mask`` minus the special tokens: the tokenizer's, else the config's special-token ids, else
    none (with a warning; :mod:`lightning_xai.adapters.huggingface.tokens`). Other keys are ignored.

    The module is an ``nn.Module`` holding the model (``adapter.model``): ``.eval()``, ``.to()``, ``.parameters()``
    act on the model. The model keeps its attention implementation; the adapter's forward passes run on
    lightning_xai's registered eager attention and restore it (see the module docstring).

    The model may come wrapped as it trains: a PEFT model (LoRA, IA3, ... with ``modules_to_save`` heads),
    ``torch.compile``, DDP/FSDP; the adapter explains the ``transformers`` model inside
    (:mod:`~lightning_xai.adapters.huggingface.unwrap`) and checks its logits against the wrapper's own.

    Args:
        model: a ``PreTrainedModel`` for sequence classification (``AutoModelForSequenceClassification``), bare
            or wrapped (see above).
        tokenizer: its tokenizer; used to check that ids fit the model's vocabulary and to find special tokens.
        attention: the reduction reported as ``ExplainOutput.attention`` (see the module docstring).
        override_specials: ``"keep"`` or ``"zero"``: what a ``[B, T]`` override does with each head's mass on the
            special tokens.
        query_index: an explicit query position (same for every row) replacing the detected pooled position; the
            default ``None`` finds it per model and per row (see :mod:`lightning_xai.adapters.huggingface.pooling`); the
            attribute then reads 0 for a first-token head and stays ``None`` for per-row (last-token, mean) heads.
            A last-token head's logits are read at ``query_index`` too, so a wrong position fails the logits
            self-check instead of explaining a pad.
        check: compare the adapter's logits with the model's own on the first eval-mode ``forward(batch)`` and
            raise on a mismatch (:meth:`check_logits`; callers that never call ``forward`` run
            :func:`~lightning_xai.adapters.checks.check_logits` themselves).

    Raises:
        ProtocolError: no reachable input embedding layer, or attention not dispatched through transformers'
            attention interface.
        ValueError: tokenizer/model vocabulary mismatch, unknown reduction.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> _ = torch.manual_seed(0)
        >>> config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        ...                     intermediate_size=16, max_position_embeddings=16, attn_implementation="eager")
        >>> adapter = HuggingFaceAdapter(BertForSequenceClassification(config).eval())
        >>> batch = {"input_ids": torch.tensor([[2, 7, 8, 3, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 0]]),
        ...          "mask": torch.tensor([[False, True, True, False, False]])}
        >>> out = adapter(batch)
        >>> out.logits.shape, len(out.raw_attentions), out.raw_attentions[-1].shape
        (torch.Size([1, 2]), 2, torch.Size([1, 2, 5, 5]))
        >>> out.attention.sum().item(), out.attention[0, [0, 3, 4]].tolist()
        (1.0, [0.0, 0.0, 0.0])
        >>> again = adapter(batch, attention_override=out.extras["cls_rows"])
        >>> torch.equal(again.logits, out.logits)
        True
    """

    # set with object.__setattr__ (modules inside ``model``, not registered: no duplicate state_dict keys); declared
    # here because nn.Module's __getattr__ types unknown attributes as Tensor | Module
    reference: nn.Module
    _embedding: nn.Embedding
    _attention_modules: List[nn.Module]

    def __new__(cls, *args: Any, **kwargs: Any) -> "HuggingFaceAdapter":
        """A direct subclass whose ``explains(model)`` is True is built instead (a generator:
        :mod:`~lightning_xai.adapters.huggingface.generation`), so ``HuggingFaceAdapter(model)`` fits any model."""
        model = args[0] if args else kwargs.get("model")
        if cls is HuggingFaceAdapter and model is not None:
            cls = next((sub for sub in cls.__subclasses__() if sub.explains(model)), cls)
        return super().__new__(cls)

    @classmethod
    def explains(cls, model: nn.Module) -> bool:
        """Whether ``HuggingFaceAdapter(model)`` builds this subclass: never, unless a subclass claims its models by
        overriding this (a subclass that only changes behaviour is built by name)."""
        return False

    def _hold(
        self, model: nn.Module, tokenizer: Any, attention: Reduction, override_specials: str, query_index: Optional[int]
    ) -> nn.Module:
        """Take ``model`` out of its wrappers (PEFT, ``torch.compile``, DDP, ...) and keep it with the options every
        adapter of this family shares; returns the unwrapped ``transformers`` model."""
        if override_specials not in ("keep", "zero"):
            raise ValueError(f"override_specials must be 'keep' or 'zero', got {override_specials!r}.")
        found = unwrap(model)
        self.model = found.model
        #: the module whose forward the user trains (the PEFT model, else ``model``); not a submodule
        object.__setattr__(self, "reference", found.reference)
        #: the wrappers taken off the given module, outermost first (``torch.compile``'s ``OptimizedModule``, ...)
        self.wrappers = found.wrappers
        self.tokenizer = tokenizer
        self.override_specials = override_specials
        self.query_index = query_index
        self._reduce = parse_reduction(attention)
        self.attention_name = attention if isinstance(attention, str) else getattr(attention, "__name__", "callable")
        # a reference, not a registered submodule: it already lives inside ``model`` (no duplicate state_dict keys)
        object.__setattr__(self, "_embedding", self._find_embedding(self.model))
        return self.model

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        attention: Reduction = "cls_last_mean",
        override_specials: str = "keep",
        query_index: Optional[int] = None,
        check: bool = True,
    ) -> None:
        super().__init__()
        model = self._hold(model, tokenizer, attention, override_specials, query_index)
        try:
            detected = detect_pooling(model)
        except ProtocolError:
            if query_index is None:
                raise
            detected = "index"
        #: where the head reads: "first", "last", "mean", or "index" (an explicit ``query_index``)
        self.pooling = detected if query_index is None else "index"
        self._head_pooling = detected
        if query_index is None and detected == "first":  # one fixed row for every example: say which
            self.query_index = 0
        self.causal = is_causal(model, detected)
        self._checked = not check
        check_tokenizer(tokenizer, self._embedding, getattr(model, "config", None))
        with recording_attention(model) as overridable:  # checks the model can switch; restores its own
            self.overridable = overridable
        object.__setattr__(self, "_attention_modules", self._find_attention_modules(model))
        #: overrides go through a hook on the attention dropout of a family with native attention (DeBERTa-v2)
        self._native = not overridable and bool(native_attention_modules(model))
        if self._native:
            self.overridable = True
            object.__setattr__(self, "_attention_modules", native_attention_modules(model))

    # --- construction checks ------------------------------------------------------------------------------
    _find_embedding = staticmethod(input_embedding)
    _find_attention_modules = staticmethod(recorded_attention_modules)

    # --- the ExplainableModel protocol -----------------------------------------------------------------------
    @property
    def pad_token_id(self) -> Optional[int]:
        """The pad id (tokenizer's, else the model config's): the "pad" baseline of IG and leave-one-out."""
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return pad if pad is not None else getattr(getattr(self.model, "config", None), "pad_token_id", None)

    @property
    def head_kind(self) -> str:
        """:class:`~lightning_xai.adapters.capabilities.HeadKind`: ``"regression"``, ``"sigmoid"`` or ``"softmax"``,
        from ``config.problem_type`` and ``num_labels`` (:func:`~lightning_xai.adapters.huggingface.heads.head_kind`)."""
        return config_head_kind(getattr(self.model, "config", None))

    @property
    def max_length(self) -> Optional[int]:
        """The longest sequence the model's position embeddings allow (``None`` if unknown): RoBERTa-style
        embeddings skip ``padding_idx + 1`` position ids (:func:`~lightning_xai.adapters.huggingface.inputs.
        position_offset`)."""
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return None if limit is None else int(limit) - self._positions_skipped()

    def embed(self, batch: Batch) -> Tensor:
        """``[B, T, E]`` word embeddings of ``batch["input_ids"]`` (graph-connected to the embedding table)."""
        if "input_ids" not in batch:
            raise KeyError(
                "Batch has no 'input_ids'; HF batches need input_ids and attention_mask "
                "(see lightning_xai.data.hf.WordPieceCollator)."
            )
        ids = batch["input_ids"]
        check_token_ids(ids, self._embedding.num_embeddings, "Tokenizer/model mismatch: input_ids")
        check_sequence_length(
            ids.shape[1],
            getattr(getattr(self.model, "config", None), "max_position_embeddings", None),
            self._positions_skipped(),
        )
        with gathered(self.model, [self._embedding]):  # FSDP2: called outside the root's forward (adapters.sharding)
            return self._embedding(ids)

    def embedding_table(self) -> Tensor:
        """:class:`~lightning_xai.adapters.capabilities.EmbeddingShift`: the ``[V, E]`` word embedding table."""
        return self._embedding.weight

    def embedding_shift_refusal(self) -> Optional[str]:
        """Why the word embeddings cannot be shifted with compensation (``None``: they can), see
        :mod:`~lightning_xai.adapters.huggingface.shift`."""
        return embedding_shift_refusal(self.model, self._embedding)

    def shift_embeddings(self, shift: Tensor) -> None:
        """:class:`~lightning_xai.adapters.capabilities.EmbeddingShift`: in place, ``+ shift`` on every word
        embedding and ``− shift`` on a table added at every position (positions, token types), checked on a probe."""
        shift_input_embeddings(self.model, self._embedding, shift)

    def randomization_layers(self) -> List[str]:
        """The modules Adebayo et al.'s cascading randomisation re-initialises, from the output to the input
        (dotted names from this adapter; :func:`~lightning_xai.adapters.huggingface.parts.randomization_stages`)."""
        names = {module: name for name, module in self.named_modules()}
        return [names[m] for m in randomization_stages(self.model, self._embedding, self._attention_modules)]

    def token_mask(self, batch: Batch) -> Tensor:
        """``[B, T]`` bool: real word-pieces (``batch["mask"]``, else attention_mask minus special tokens)."""
        if "mask" in batch:
            mask = batch["mask"]
            if mask.dtype != torch.bool:
                raise TypeError(f"'mask' must be a bool tensor, got {mask.dtype}; use mask.bool().")
            return mask
        return real_token_mask(batch, self.tokenizer, getattr(self.model, "config", None), owner=self)

    @staticmethod
    def _attention_mask(batch: Batch) -> Tensor:
        if "attention_mask" not in batch:
            raise KeyError(
                "Batch has no 'attention_mask' (1 at every non-pad position, special tokens included); "
                "collate with lightning_xai.data.hf.WordPieceCollator or the tokenizer's padding."
            )
        return batch["attention_mask"]

    def _positions_skipped(self) -> int:
        """:func:`~lightning_xai.adapters.huggingface.inputs.position_offset` of the model, found once."""
        if "_position_offset" not in self.__dict__:  # set on first use: subclasses may build without __init__
            self._position_offset = position_offset(self.model)
        return self._position_offset

    def _check_inputs(self, batch: Batch) -> None:
        """The protocol boundary's checks of a batch (see :meth:`forward_from_embeddings`)."""
        if "input_ids" in batch:
            check_attention_mask(self._attention_mask(batch), batch["input_ids"], batch.get("mask"))
            warn_missing_token_types(batch, getattr(self.model, "config", None), self.tokenizer, owner=self)

    def _last_module_calls(self) -> int:
        """How many layers run the last attention module (the family table's shared layers: ALBERT)."""
        return module_calls(self.model.config, -1)

    def query_mask(self, batch: Batch) -> Tensor:
        """``[B, T]`` bool: the query position(s) whose attention row each example's classifier reads."""
        return query_mask(
            self._head_pooling if self.query_index is None else "index",
            batch,
            self._attention_mask(batch),
            self.pad_token_id,
            self.query_index,
        )

    def _run(
        self, embeddings: Tensor, batch: Batch, attention_override: Optional[Tensor], *, maps: bool = True
    ) -> Tuple[Tensor, Any, Tensor, Tensor]:
        """``(logits, the model's output, token mask, query mask)`` of one pass; ``maps=False`` asks the model for
        no attention maps and hidden states (:func:`~lightning_xai.adapters.huggingface.classifier_pass.run_pass`)."""
        return run_pass(self, embeddings, batch, attention_override, maps=maps)

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Batch, *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        """Run the classifier from word embeddings (see the module docstring for the override semantics).

        The batch is checked first: ``attention_mask`` (and ``mask``) of ``input_ids``'s shape, every row attending
        somewhere, every real token attended (:func:`~lightning_xai.adapters.checks.check_attention_mask`); a pair
        without ``token_type_ids`` for a model with token types warns once
        (:func:`~lightning_xai.adapters.huggingface.inputs.warn_missing_token_types`)."""
        self._check_inputs(batch)
        return explained_output(self, embeddings, batch, attention_override)

    def override_replay(self, embeddings: Tensor, batch: Batch) -> Tuple[ExplainOutput, Optional[OverrideScorer]]:
        """:class:`~lightning_xai.adapters.capabilities.OverrideReplay`: a scorer of overrides that runs only the
        embeddings, the last layer and the head, the earlier layers' outputs replayed
        (:func:`~lightning_xai.adapters.huggingface.replay.override_replay`)."""
        return override_replay(self, embeddings, batch)

    @torch.no_grad()
    def reference_logits(self, batch: Batch) -> Tensor:
        """:class:`~lightning_xai.adapters.capabilities.ReferenceLogits`: the logits of the module the user trains
        (the PEFT model, else the model) run on ``input_ids`` the way its user runs it (eval mode, restored)."""
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": self._attention_mask(batch)}
        if "token_type_ids" in batch:
            kwargs["token_type_ids"] = batch["token_type_ids"]
        # eager with finite masks (a stacked -inf mask gives NaN on pads); the wrapper's own modules too
        with recording_attention(self.model), evaluating(self.reference):
            return self.reference(**kwargs).logits

    def describe_reference(self) -> Tuple[str, str]:
        """:class:`~lightning_xai.adapters.capabilities.ReferenceLogits`: the reference's name and the fix."""
        return type(self.reference).__name__, (
            f"The adapter read pooling={self.pooling!r}, query_index={self.query_index}. Check query_index (leave it "
            "None: the adapter finds where the head reads, each row's last real token for a decoder, left or right "
            "padding), the batch's attention_mask/token_type_ids and the config's pad_token_id."
        )

    def check_logits(self, batch: Batch, atol: float = 1e-4) -> float:
        """Compare the adapter's logits with the model's own (``model(input_ids=...)``); return max ``|Δlogit|``.

        :func:`lightning_xai.adapters.checks.check_logits` on this adapter (eval mode, no gradient).

        Raises:
            ValueError: when they differ by more than ``atol`` (relative to the logits' scale), naming the fix.
        """
        gap = check_logits(self, batch, rtol=atol)
        assert gap is not None  # None only for a model without a reference; the adapter has one
        return gap

    def forward(self, batch: Batch, attention_override: Optional[Tensor] = None) -> ExplainOutput:
        """``forward_from_embeddings(embed(batch), batch, attention_override=...)``.

        The first call in eval mode (no dropout) first runs :meth:`check_logits` on the batch (``check=False`` at
        construction skips it).
        """
        if not self._checked and not self.model.training and attention_override is None:
            self._checked = True
            self.check_logits(batch)
        return self.forward_from_embeddings(self.embed(batch), batch, attention_override=attention_override)
