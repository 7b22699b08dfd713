"""See a ``transformers`` generator (``*ForCausalLM``, an encoder–decoder) through the one explainable protocol.

:class:`HuggingFaceAdapter` builds a :class:`HuggingFaceGenerationAdapter` when the model it is given generates
text (``model.can_generate()``: Llama/Qwen2/GPT-2 ``*ForCausalLM``/``*LMHeadModel``, BART/Marian/T5
``*ForConditionalGeneration``/``*MTModel``, ``EncoderDecoderModel``), so ``explainable_model(module)`` finds one
in an unmodified module as it finds a classifier. The explained output is a **target sequence**, not a class.

**Design.** One protocol and one ``attribute`` verb: a generator is an
:class:`~lightning_xai.adapters.ExplainableModel` whose output carries the log-probabilities of its target tokens
(``ExplainOutput.target_log_probs`` ``[B, K]``, ``target_steps`` ``[B, K]``), and it says so with the
:class:`~lightning_xai.adapters.capabilities.TargetSequence` capability. Every attribution method runs its usual
``forward_from_embeddings`` → score path; :mod:`lightning_xai.attribution.targets` reads the score from
``target_log_probs`` (the sum: ``log p(target | source)``, the default, or one step's ``log p(y_k | y_<k,
source)`` with ``target=k``; ``target="steps"`` gives the per-step maps ``[B, K, T]``). The explained quantity is a
log-probability, never a softmax over classes (``output="probability"`` is its exponential, ``"logit"`` is refused).

**Batches.** ``input_ids``, ``attention_mask`` and ``labels`` (-100 where nothing is explained):

* causal LM: ``labels`` ``[B, T]`` aligned with ``input_ids`` (the prompt is every position before the first
  target position; transformers shifts: the logits at ``s − 1`` score the token at ``s``);
* encoder–decoder: ``input_ids`` is the source, ``labels`` ``[B, S]`` the target; the decoder reads
  ``decoder_input_ids`` from the batch, else ``model.prepare_decoder_input_ids_from_labels(labels)`` (what the
  model's own ``forward(labels=...)`` does); ``decoder_attention_mask`` is passed when present.

**Per-step maps.** :meth:`HuggingFaceGenerationAdapter.step_passes` (the
:class:`~lightning_xai.adapters.capabilities.StepPasses` capability) gives one copy of a row per explained step, cut
after the step and flagged so that the LM head runs at the step's query row only (:mod:`.step_copies`).

"Force decoding" explains the batch's own ``labels``; "free decoding" explains the model's greedy output:
:meth:`HuggingFaceGenerationAdapter.greedy_targets` returns the batch with its target replaced by it.

**What the maps cover.** ``token_mask`` is the *source*: the encoder input's real tokens, or a causal LM's prompt
(real tokens before each row's first target position). A causal LM's teacher-forced target tokens are inputs of
later steps too, but they are not in the map: every method reports 0 there, Integrated Gradients' baselines and
SmoothGrad's noise leave them (and special tokens) as they are, and leave-one-out deletes prompt tokens only. The
maps answer "which source tokens explain the target", the question word alignments ask (Ding, Xu & Koehn 2019).

**Attention.** Target step ``k`` is read by one query row: position ``s − 1`` of a causal LM's decoder
self-attention (its row over the prompt and the earlier target tokens), position ``s`` of an encoder–decoder's
*cross-attention* over the source. The adapter's reduction (``attention=``, the same names as for classifiers:
``"cls_last_mean"`` is the last layer's row averaged over heads, ``"L:H"``, ``"rollout"`` for causal LMs only: an
encoder–decoder refuses it when built, its step rows being cross-attention) is applied
to each step's row and renormalised over the source tokens (the row's mass on special tokens and earlier target
tokens is left out): ``extras["step_attention"]`` ``[B, K, T]``. ``ExplainOutput.attention`` ``[B, T]`` is the mean
of a row's step distributions (the target's attention over the source); ``raw_attentions`` are the decoder
self-attention maps of a causal LM, the cross-attention maps of an encoder–decoder
(``extras["decoder_attentions"]``, ``extras["encoder_attentions"]`` hold the others).

**Overrides.** ``attention_override`` replaces the step rows of the last layer's attention (the last decoder
layer's cross-attention for an encoder–decoder) for every head, as a classifier's override replaces its pooled row:
``[B, T]`` one distribution over the source for every step, ``[B, K, T]`` one per step, ``[B, K, heads, T]`` raw rows
(``extras["step_rows"]`` of a pass reproduces its logits exactly). ``override_specials`` says what a distribution
does with each head's mass outside the source (see :func:`~lightning_xai.adapters.huggingface.steps.
step_override_rows`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.checks import evaluating
from lightning_xai.adapters.huggingface.adapter import HuggingFaceAdapter
from lightning_xai.adapters.huggingface.attention import OverrideState, active_override, recording_attention
from lightning_xai.adapters.huggingface.decoding import DECODER_KEYS, greedy_targets
from lightning_xai.adapters.huggingface.families import family_of, module_calls
from lightning_xai.adapters.huggingface.inputs import check_tokenizer
from lightning_xai.adapters.huggingface.parts import last_cross_attention
from lightning_xai.adapters.huggingface.reductions import Reduction, renormalise, token_distribution
from lightning_xai.adapters.huggingface.step_copies import STEP_LOGITS_ONLY, StepPass, logits_at_queries, step_passes
from lightning_xai.adapters.huggingface.steps import IGNORE_INDEX, Steps, step_override_rows, step_rows, target_steps
from lightning_xai.adapters.huggingface.unwrap import unchecked_layers, unwrap
from lightning_xai.adapters.protocol import Batch, ExplainOutput, ProtocolError, check_embeddings

__all__ = ["HuggingFaceGenerationAdapter", "is_generator"]


def is_generator(module: Any) -> bool:
    """Whether ``module`` (bare or wrapped) is a ``transformers`` model that generates text (``can_generate()``).

    Example:
        >>> from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel
        >>> config = GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=20)
        >>> is_generator(GPT2LMHeadModel(config)), is_generator(GPT2ForSequenceClassification(config))
        (True, False)
    """
    if not isinstance(module, nn.Module):
        return False
    try:
        module = unwrap(module).model
    except ProtocolError:
        return False
    can = getattr(module, "can_generate", None)
    try:
        return bool(callable(can) and can())
    except Exception:  # noqa: BLE001 - a model that cannot say is not one we explain as a generator
        return False


class HuggingFaceGenerationAdapter(HuggingFaceAdapter):
    """A ``transformers`` causal LM or encoder–decoder seen through the :class:`ExplainableModel` protocol, with the
    :class:`~lightning_xai.adapters.capabilities.TargetSequence` capability (see the module docstring).

    Built by :class:`HuggingFaceAdapter` (same arguments) for a model that generates; ``query_index`` does not apply.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> _ = torch.manual_seed(0)
        >>> config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        ...                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
        >>> adapter = HuggingFaceAdapter(LlamaForCausalLM(config).eval())
        >>> type(adapter).__name__
        'HuggingFaceGenerationAdapter'
        >>> batch = {"input_ids": torch.tensor([[5, 6, 7, 8, 9]]), "attention_mask": torch.ones(1, 5, dtype=torch.long),
        ...          "labels": torch.tensor([[-100, -100, -100, 8, 9]])}
        >>> out = adapter(batch)
        >>> adapter.token_mask(batch).tolist(), out.target_log_probs.shape, out.extras["step_attention"].shape
        ([[True, True, True, False, False]], torch.Size([1, 2]), torch.Size([1, 2, 5]))
        >>> torch.equal(adapter(batch, attention_override=out.extras["step_rows"]).logits, out.logits)
        True
    """

    #: the module whose call the override replaces (set with object.__setattr__, see :class:`HuggingFaceAdapter`)
    _override_module: Optional[nn.Module]

    @classmethod
    def explains(cls, model: nn.Module) -> bool:
        """Whether :class:`HuggingFaceAdapter` should build this class for ``model`` (a generator)."""
        return is_generator(model)

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        attention: Reduction = "cls_last_mean",
        override_specials: str = "keep",
        query_index: Optional[int] = None,
        check: bool = True,
    ) -> None:
        nn.Module.__init__(self)
        if query_index is not None:
            raise ValueError(
                "query_index does not apply to a generation model: each target step is read by the query "
                "row that predicts it (see lightning_xai.adapters.huggingface.generation); leave it None."
            )
        self._hold(model, tokenizer, attention, override_specials, None)
        config = self.model.config
        #: an encoder–decoder (the source is the encoder input) rather than a causal LM (the prompt)
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self.causal = not self.encoder_decoder
        if self.encoder_decoder and self.attention_name == "rollout":
            raise ValueError(
                f"attention='rollout' is not defined for {type(self.model).__name__} (model_type="
                f"{getattr(config, 'model_type', None)!r}), an encoder–decoder: rollout composes square "
                "self-attention maps of one sequence, and a target step reads the source through cross-attention "
                "[target, source] (even when the two are as long, composing those maps mixes positions of different "
                "sequences). Use 'cls_last_mean' or 'L:H'."
            )
        self.pooling = "steps"
        self._embedding_scale = self._find_embedding_scale()
        self._checked = not check
        check_tokenizer(tokenizer, self._embedding, getattr(self.model, "config", None))
        with recording_attention(self.model) as overridable:
            self.overridable = overridable
        if self.encoder_decoder:
            module = last_cross_attention(self.model)
        else:
            modules = self._find_attention_modules(self.model)
            module = modules[-1] if modules else None
        object.__setattr__(self, "_override_module", module)

    def _find_embedding_scale(self) -> float:
        """The factor an encoder applies to its word embeddings only when it looks them up itself (Marian):
        ``embed`` applies it so that ``inputs_embeds=`` computes the model's own function."""
        path = getattr(family_of(self.model.config), "embedding_scale", None)
        get_encoder = getattr(self.model, "get_encoder", None)
        if not path or not callable(get_encoder):
            return 1.0
        return float(getattr(get_encoder(), path))

    # --- the TargetSequence capability ------------------------------------------------------------------------
    @staticmethod
    def _labels(batch: Batch) -> Tensor:
        if "labels" not in batch:
            raise KeyError(
                "A generation batch needs 'labels', the target (-100 where nothing is explained: a causal "
                "LM's prompt, padding). To explain the model's own output, build it with "
                "adapter.greedy_targets(batch)."
            )
        return batch["labels"]

    def target_positions(self, batch: Batch) -> Tensor:
        """``[B, S]`` bool: the explained positions of ``batch["labels"]`` (``!= -100``)."""
        return self._labels(batch) != IGNORE_INDEX

    def target_keys(self, batch: Batch) -> Tuple[str, ...]:
        """``()`` for a causal LM (labels follow ``input_ids``); the decoder-side keys of an encoder–decoder."""
        return tuple(k for k in DECODER_KEYS if k in batch) if self.encoder_decoder else ()

    def _steps(self, batch: Batch) -> Steps:
        return target_steps(self._labels(batch), causal=self.causal)

    # --- the ExplainableModel protocol -----------------------------------------------------------------------
    def embed(self, batch: Batch) -> Tensor:
        """``[B, T, E]`` word embeddings of ``input_ids`` (the source / prompt and, for a causal LM, the target)."""
        embeddings = super().embed(batch)
        return embeddings * self._embedding_scale if self._embedding_scale != 1.0 else embeddings

    def token_mask(self, batch: Batch) -> Tensor:
        """``[B, T]`` bool: the source tokens (``batch["mask"]``, else non-pad non-special tokens); for a causal LM
        only those before each row's first target position (the prompt)."""
        mask = super().token_mask(batch)
        if self.encoder_decoder:
            return mask
        explained = self.target_positions(batch)
        if explained.shape != mask.shape:
            raise ValueError(
                f"a causal LM's labels must be aligned with input_ids: labels are "
                f"{tuple(explained.shape)}, input_ids {tuple(mask.shape)}."
            )
        before = explained.long().cumsum(1) == 0
        return mask & before.to(mask.device)

    def query_mask(self, batch: Batch) -> Tensor:
        """``[B, Q]`` bool: the query positions that predict target tokens (decoder positions for an encoder–decoder)."""
        steps = self._steps(batch)
        labels = self._labels(batch)
        where = torch.zeros(labels.shape, dtype=torch.bool, device=labels.device)
        where[steps.rows, steps.queries] = True
        return where

    def _decoder_kwargs(self, batch: Batch) -> dict:
        if not self.encoder_decoder:
            return {}
        kwargs = {}
        if "decoder_input_ids" in batch:
            kwargs["decoder_input_ids"] = batch["decoder_input_ids"]
        else:
            prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
            if not callable(prepare):
                raise ProtocolError(
                    f"{type(self.model).__name__} has no prepare_decoder_input_ids_from_labels; give "
                    "the batch its decoder_input_ids (the labels shifted right)."
                )
            kwargs["decoder_input_ids"] = prepare(labels=self._labels(batch))
        if "decoder_attention_mask" in batch:
            kwargs["decoder_attention_mask"] = batch["decoder_attention_mask"]
        return kwargs

    def _model_output(
        self,
        embeddings: Tensor,
        batch: Batch,
        state: Optional[OverrideState] = None,
        maps: bool = True,
        decoder: Optional[dict] = None,
    ) -> Any:
        """The model's output run from ``embeddings`` on lightning_xai's attention (``state``: an override)."""
        kwargs = {
            "inputs_embeds": embeddings,
            "attention_mask": self._attention_mask(batch),
            "output_attentions": maps,
            "output_hidden_states": maps,
            "return_dict": True,
            "use_cache": False,
        }
        if "position_ids" in batch and not self.encoder_decoder:
            kwargs["position_ids"] = batch["position_ids"]
        kwargs.update(self._decoder_kwargs(batch) if decoder is None else decoder)
        token = active_override().set(state) if state is not None else None
        try:
            with recording_attention(self.model), unchecked_layers(self.model):
                return self.model(**kwargs)
        finally:
            if token is not None:
                active_override().reset(token)

    def _override_state(self, override: Tensor, batch: Batch, steps: Steps, mask: Tensor) -> OverrideState:
        if not self.overridable:
            raise ProtocolError(
                f"{type(self.model).__name__} computes attention inside its own modeling file, so "
                "attention_override is not supported."
            )
        if self._override_module is None:
            raise ProtocolError(
                f"{type(self.model).__name__} does not declare the attention modules the override "
                "replaces (_can_record_outputs); use HookAdapter for this model."
            )
        queries = torch.zeros(self._labels(batch).shape, dtype=torch.bool, device=mask.device)
        queries[steps.rows, steps.queries] = True
        rows = step_override_rows(override, steps, self._attention_mask(batch).bool(), mask, self.override_specials)
        calls = module_calls(self.model.config, -1) if self.causal else 1  # shared layers (ALBERT-like decoders)
        return OverrideState(self._override_module, queries, rows, calls=calls)

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Batch, *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        """Run the generator from word embeddings (see the module docstring for what is returned and overridden)."""
        mask = self.token_mask(batch)
        check_embeddings(embeddings, mask)
        steps = self._steps(batch)
        state = None if attention_override is None else self._override_state(attention_override, batch, steps, mask)
        only = bool(batch.get(STEP_LOGITS_ONLY, False))  # a copy of step_passes: the LM head at the queries only
        with logits_at_queries(self.model, steps) if only else nullcontext(False) as gathered:
            output = self._model_output(embeddings, batch, state)
        labels = self._labels(batch)
        logits = output.logits
        step_logits = logits[:, 0] if gathered else logits[steps.rows, steps.queries]
        log_probs = step_logits.log_softmax(-1).gather(-1, labels[steps.rows, steps.positions][:, None]).squeeze(-1)
        target_log_probs = steps.compact(log_probs)
        raw = tuple(output.cross_attentions if self.encoder_decoder else output.attentions or ())
        if not raw:
            raise ProtocolError(
                f"{type(self.model).__name__} returned no attention maps; load it with attn_implementation='eager'."
            )
        step_attention = self._step_attention(raw, batch, steps, mask)
        count = steps.mask.sum(1, keepdim=True).clamp_min(1).to(step_attention.dtype)
        attention = renormalise(step_attention.sum(1) / count, mask)
        if self.encoder_decoder:
            hidden = output.encoder_last_hidden_state
            extras = {
                "decoder_attentions": output.decoder_attentions,
                "encoder_attentions": output.encoder_attentions,
                "all_hidden_states": output.encoder_hidden_states,
            }
        else:
            hidden = output.hidden_states[-1] if output.hidden_states else None
            extras = {"all_hidden_states": output.hidden_states}
        extras.update(
            step_attention=step_attention,
            step_rows=step_rows(raw[-1], steps),
            step_queries=steps.compact(steps.queries),
        )
        return ExplainOutput(
            logits=steps.compact(step_logits) if gathered else logits,
            attention=attention,
            hidden_states=hidden,
            raw_attentions=raw,
            extras=extras,
            target_log_probs=target_log_probs,
            target_steps=steps.mask,
        )

    def _step_attention(self, raw: Tuple[Tensor, ...], batch: Batch, steps: Steps, mask: Tensor) -> Tensor:
        """``[B, K, T]``: the reduction of each step's query row, renormalised over the source tokens."""
        B, K = steps.mask.shape
        queries = steps.compact(steps.queries)
        width = raw[-1].shape[2]
        parts: List[Tensor] = []
        for k in range(K):
            qmask = torch.nn.functional.one_hot(queries[:, k], width).bool()
            reduced = token_distribution(self._reduce(raw, batch, qmask), mask)
            parts.append(reduced * steps.mask[:, k, None].to(reduced.dtype))
        return torch.stack(parts, 1) if parts else mask.new_zeros((B, 0, mask.shape[1]), dtype=torch.float)

    def step_passes(self, batch: Batch, wanted: Tensor, tokens_per_pass: int) -> List[StepPass]:
        """One copy of a row per wanted step, cut to what the step reads, in dense passes (:mod:`.step_copies`)."""
        return step_passes(self, batch, self._steps(batch), wanted, self._decoder_kwargs(batch), tokens_per_pass)

    def override_replay(self, embeddings: Tensor, batch: Batch) -> Tuple[ExplainOutput, None]:
        """Declines (``None`` scorer): a generator's overrides are scored by full passes."""
        return self.forward_from_embeddings(embeddings, batch), None

    @torch.no_grad()
    def reference_logits(self, batch: Batch) -> Tensor:
        """The module the user trains, run on ``input_ids`` (and the decoder inputs from ``labels``): ``[B, S, V]``."""
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": self._attention_mask(batch), "use_cache": False}
        kwargs.update(self._decoder_kwargs(batch))
        with recording_attention(self.model), evaluating(self.reference):
            return self.reference(**kwargs).logits

    def describe_reference(self) -> Tuple[str, str]:
        """The reference's name and the fix for a mismatch."""
        return type(self.reference).__name__, (
            "Check the batch's attention_mask and decoder inputs, and whether the encoder scales its word embeddings "
            "itself (the family table's embedding_scale, lightning_xai.adapters.huggingface.families)."
        )

    # --- free decoding ----------------------------------------------------------------------------------------
    def greedy_targets(self, batch: Batch, max_new_tokens: int = 20) -> Batch:
        """ "Free decoding": ``batch`` with ``labels`` the model's own greedy continuation
        (:func:`~lightning_xai.adapters.huggingface.decoding.greedy_targets`)."""
        return greedy_targets(self, batch, max_new_tokens)
