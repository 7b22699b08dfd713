"""Word alignments from a generator's attention and saliency maps, scored against human links while it trains."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import Tensor
from typing_extensions import override

from lightning_xai.adapters.capabilities import TargetSequence
from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.attribution import ATTRIBUTION_METHODS
from lightning_xai.callbacks._audit.generation import check_generation_methods, is_generator_model, method_step_maps
from lightning_xai.callbacks._audit.options import check_names, check_options_of_methods
from lightning_xai.callbacks.attention_audit import DEFAULT_METHOD_OPTIONS
from lightning_xai.callbacks.base import AuditCallback, AuditExample, AuditPrediction, AuditResult, BatchResult
from lightning_xai.metrics.alignment import AlignmentErrorRate
from lightning_xai.metrics.functional.alignment_extraction import (
    LINK_RULES,
    WORD_POOLINGS,
    extract_links,
    pool_to_words,
)

__all__ = ["AlignmentAudit", "DEFAULT_ALIGNMENT_METHODS"]

#: saliency maps scored by default besides attention (Ding, Xu & Koehn 2019 read alignments from gradients)
DEFAULT_ALIGNMENT_METHODS: Tuple[str, ...] = ("gradient", "grad_x_input")
_SCORES = ("aer", "precision", "recall", "f1")


class AlignmentAudit(AuditCallback):
    """Alignment error rate of the word alignments a generator's maps induce (Ding, Xu & Koehn 2019), per map.

    For every audited sentence pair and every map — the adapter's attention (``"attention"``: its reduction, by
    default the last layer's rows averaged over heads), each layer's attention rows averaged over heads
    (``"attention_layer_<l>"``: an encoder–decoder's cross-attention, a causal LM's self-attention rows over its
    prompt) and each saliency method of ``methods`` (one map per target step, ``attribute(..., target="steps")``: the
    step's log-probability explained) — the audit builds a source × target score map, pools it from tokens to words,
    links each target word to its highest-scoring source word (``rule="target_argmax"``, the rule of Ding et al.) and
    counts the links against the gold ones. Logged per map, over the whole audit subset (corpus-level counts, as in
    the shared tasks; summed over processes under DDP by :class:`~lightning_xai.metrics.AlignmentErrorRate`):
    ``alignment_audit/<map>/aer``, ``/precision``, ``/recall``, ``/f1``, and ``alignment_audit/sentences``.

    **Batch contract.** A generation batch (``input_ids``, ``attention_mask``, ``labels`` with -100 where nothing is
    explained; force decoding: the gold links refer to the batch's own target) plus

    * ``batch[alignment_key]`` (``"alignment"``): per row the sure links, a list of ``(source_word, target_word)``
      pairs, or a bool ``[S_words, T_words]`` matrix (a collated bool ``[B, S, T]`` padded with False works too);
    * optionally ``batch[possible_key]`` (``"possible_alignment"``): per row the possible links, same forms;
    * optionally ``batch[source_words_key]`` (``"source_words"``): ``LongTensor[B, T]``, the source word of each
      ``input_ids`` position, -1 for none (special tokens, padding, a causal LM's target). Without it every real
      source token (the adapter's ``token_mask``) is one word, in order;
    * optionally ``batch[target_words_key]`` (``"target_words"``): ``LongTensor`` shaped like ``labels``, the target
      word of each explained label position, -1 for none (an end-of-sequence token, a piece of no word). Without it
      every target token is one word, in order;
    * optionally ``batch[exclude_key]`` (``"target_exclude"``): per row the target words no link may point to (0/1
      per target word, e.g. the bundled corpus's ``target_exclude``: punctuation the annotators left out).

    Words pool pieces with ``source_reduce`` (``"sum"``) and ``target_reduce`` (``"mean"``)
    (:func:`~lightning_xai.metrics.functional.pool_to_words`). Word indices run 0..n−1 without gaps; a gold link
    outside the words found is an error naming the row.

    Args:
        methods: saliency methods scored besides attention (``()``: attention only). Methods that read a
            classifier's logits (``lrp``, ``integrated_hessians``, the context-mixing methods) are refused.
        layers: also score each layer's attention (``attention_layer_<l>``).
        rule: how links are extracted (:data:`~lightning_xai.metrics.functional.alignment_extraction.LINK_RULES`;
            ``"threshold"`` needs ``threshold``).
        threshold: the score threshold of ``rule="threshold"``.
        method_options: per-method options for ``attribute`` (over the ``grad_x_input`` magnitude default of
            :class:`AttentionAudit`).
        alignment_key / possible_key / source_words_key / target_words_key / exclude_key: batch keys (see above).
        source_reduce / target_reduce: how pieces pool to words.
        **kwargs: scheduling and subset options of :class:`~lightning_xai.callbacks.AuditCallback`.

    Example:
        >>> audit = AlignmentAudit(methods=("gradient",), layers=False)
        >>> audit.maps
        ['attention', 'gradient']
        >>> AlignmentAudit(rule="argmax")
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AlignmentAudit(rule='argmax'): choose one of target_argmax, source_argmax, intersection, threshold.
    """

    name = "alignment_audit"

    def __init__(
        self,
        methods: Sequence[str] = DEFAULT_ALIGNMENT_METHODS,
        layers: bool = True,
        rule: str = "target_argmax",
        threshold: Optional[float] = None,
        method_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
        alignment_key: str = "alignment",
        possible_key: str = "possible_alignment",
        source_words_key: str = "source_words",
        target_words_key: str = "target_words",
        exclude_key: str = "target_exclude",
        source_reduce: str = "sum",
        target_reduce: str = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(methods, str):
            raise MisconfigurationException("AlignmentAudit(methods) is a list of names, not a string.")
        methods = [str(m) for m in methods]
        if "attention" in methods or len(set(methods)) != len(methods):
            raise MisconfigurationException(
                f"AlignmentAudit(methods={methods}): list each saliency method once; attention is always scored."
            )
        check_names(
            "AlignmentAudit",
            "method",
            methods,
            ATTRIBUTION_METHODS,
            " (or register one with lightning_xai.attribution.register_method)",
        )
        if rule not in LINK_RULES:
            raise MisconfigurationException(f"AlignmentAudit(rule={rule!r}): choose one of {', '.join(LINK_RULES)}.")
        if (rule == "threshold") != (threshold is not None):
            raise MisconfigurationException("AlignmentAudit: threshold= goes with rule='threshold' (and only with it).")
        for name, reduce in (("source_reduce", source_reduce), ("target_reduce", target_reduce)):
            if reduce not in WORD_POOLINGS:
                raise MisconfigurationException(
                    f"AlignmentAudit({name}={reduce!r}): choose one of {', '.join(WORD_POOLINGS)}."
                )
        options = {k: dict(v) for k, v in (method_options or {}).items()}
        unknown = sorted(set(options) - set(methods))
        if unknown:
            raise MisconfigurationException(f"AlignmentAudit: method_options for {unknown}, not in methods {methods}.")
        check_options_of_methods("AlignmentAudit", options)
        self.methods, self.layers, self.rule, self.threshold = methods, bool(layers), rule, threshold
        self.method_options = options
        self.alignment_key, self.possible_key, self.exclude_key = alignment_key, possible_key, exclude_key
        self.source_words_key, self.target_words_key = source_words_key, target_words_key
        self.source_reduce, self.target_reduce = source_reduce, target_reduce
        self._scores: Dict[str, AlignmentErrorRate] = {}
        self._device: Any = None

    @property
    def maps(self) -> List[str]:
        """The scored maps known before the model is seen (``attention_layer_<l>`` join them at the first audit)."""
        return ["attention", *self.methods]

    def _state_config(self) -> Dict[str, Any]:
        return dict(super()._state_config(), methods=tuple(self.methods), rule=self.rule)

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        model = self.explainable(pl_module)
        if not is_generator_model(model):
            raise MisconfigurationException(
                f"AlignmentAudit scores the word alignments of a generator's target, but "
                f"{type(getattr(model, 'model', model)).__name__} explains classes (no TargetSequence capability: a "
                "transformers *ForCausalLM or encoder–decoder is one). Use AttentionAudit for a classifier."
            )
        check_generation_methods("AlignmentAudit", model, self.methods)

    def check_model(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        """The base class's probe, then: the audited batches carry the gold links."""
        super().check_model(trainer, pl_module, split)
        batches = self._audit_batches(trainer, split)
        if batches and self.alignment_key not in batches[0][2]:
            raise MisconfigurationException(
                f"AlignmentAudit: the {split!r} batches have no {self.alignment_key!r} key; give each row its gold "
                "links (a list of (source_word, target_word) pairs or a bool [S, T] matrix) or set alignment_key=."
            )

    def run_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str) -> AuditResult:
        """Audit with fresh link counts (a failed audit's partial counts never reach the next one)."""
        self._scores, self._device = {}, pl_module.device
        return super().run_audit(trainer, pl_module, stage, split)

    def aggregate(self, examples: List[AuditExample], extras: Dict[str, Any]) -> Dict[str, float]:
        """Corpus-level AER, precision, recall and F1 of every map (synced over processes), and the sentence count."""
        out: Dict[str, float] = {}
        for name in sorted(self._scores):
            found = self._scores[name].compute()
            out.update({f"{name}/{key}": float(found[key]) for key in _SCORES})
            out["sentences"] = float(found["sentences"])
        return out

    # --- one batch ----------------------------------------------------------------------------------------------
    def audit_batch(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        generator: torch.Generator,
        indices: List[int],
        prediction: Optional[AuditPrediction] = None,
    ) -> Tuple[BatchResult, Dict[str, Any]]:
        prediction = prediction or self.predict(model, batch)
        out = prediction.output
        steps = out.target_steps
        step_maps = {"attention": out.extras["step_attention"]}
        if self.layers:
            queries = out.extras["step_queries"]
            rows = torch.arange(queries.shape[0], device=queries.device)[:, None].expand_as(queries)
            for layer, raw in enumerate(out.raw_attentions):  # [B, heads, Q, T] -> each step's row, mean of heads
                step_maps[f"attention_layer_{layer}"] = raw.detach().mean(1)[rows, queries]
        step_maps.update(method_step_maps(model, batch, steps, self.methods, self._method_options, self.map_precision))
        mask = model.token_mask(batch)
        assert isinstance(model, TargetSequence)  # refuse_non_generators at setup
        positions = model.target_positions(batch)
        gold, possible = batch[self.alignment_key], batch.get(self.possible_key)
        exclude = batch.get(self.exclude_key)
        for b in range(steps.shape[0]):
            source_ids, target_ids = self._word_ids(batch, b, mask, positions, int(steps[b].sum()))
            for name, scores in step_maps.items():
                words = self._word_map(scores[b, : target_ids.numel()].detach().double(), source_ids, target_ids)
                words = words.cpu()
                links = self._extract(words, None if exclude is None else exclude[b], b)
                sure = self._gold(gold[b], words.shape, b, self.alignment_key)
                maybe = None if possible is None else [self._gold(possible[b], words.shape, b, self.possible_key)]
                self._metric(name).update([links], sure=[sure], possible=maybe)
        return BatchResult(), {}

    def _method_options(self, method: str) -> Dict[str, Any]:
        return {**DEFAULT_METHOD_OPTIONS.get(method, {}), **self.method_options.get(method, {})}

    def _metric(self, name: str) -> AlignmentErrorRate:
        if name not in self._scores:
            self._scores[name] = AlignmentErrorRate().to(self._device or "cpu")
        return self._scores[name]

    def _word_ids(
        self, batch: Mapping[str, Any], row: int, mask: Tensor, positions: Tensor, steps: int
    ) -> Tuple[Tensor, Tensor]:
        """``(source word of each input position [T], target word of each step [K_row])``, -1 for none."""
        if self.source_words_key in batch:
            source = batch[self.source_words_key][row].long()
        else:
            real = mask[row]
            source = torch.where(real, real.long().cumsum(0) - 1, torch.full_like(real, -1, dtype=torch.long))
        if self.target_words_key in batch:
            target = batch[self.target_words_key][row].long()[positions[row]]
        else:
            target = torch.arange(steps, device=mask.device)
        if target.numel() != steps:
            raise ValueError(
                f"AlignmentAudit: row {row} has {steps} target steps but {target.numel()} explained label "
                f"positions in batch[{self.target_words_key!r}]."
            )
        return source.to(mask.device), target.to(mask.device)

    def _word_map(self, step_scores: Tensor, source_ids: Tensor, target_ids: Tensor) -> Tensor:
        """``[S_words, T_words]``: a row's ``[K, T]`` step × position scores as a source × target word map."""
        return pool_to_words(
            step_scores.transpose(0, 1),
            source_ids.to(step_scores.device),
            target_ids.to(step_scores.device),
            source_reduce=self.source_reduce,
            target_reduce=self.target_reduce,
        )

    def _extract(self, words: Tensor, exclude: Any, row: int) -> Tensor:
        excluded = None
        if exclude is not None:
            excluded = torch.as_tensor(exclude, device=words.device).bool().flatten()
            if excluded.numel() < words.shape[1] or bool(excluded[words.shape[1] :].any()):
                raise ValueError(
                    f"AlignmentAudit: row {row}'s batch[{self.exclude_key!r}] covers {excluded.numel()} "
                    f"target words, the maps {words.shape[1]}: check the target word map."
                )
            excluded = excluded[: words.shape[1]]
        return extract_links(words, self.rule, threshold=self.threshold, target_exclude=excluded).cpu()

    @staticmethod
    def _gold(links: Any, shape: Tuple[int, ...], row: int, key: str) -> Tensor:
        """One row's gold links as a bool ``[S_words, T_words]`` matrix (a padded matrix cropped), checked."""
        S, T = shape
        if isinstance(links, Tensor) and links.dtype == torch.bool:
            if bool(links[S:].any()) or bool(links[:, T:].any()):
                raise ValueError(
                    f"AlignmentAudit: row {row}'s batch[{key!r}] links words beyond the {S} source × {T} "
                    "target words of its maps: the word maps and the gold links disagree."
                )
            full = torch.zeros(S, T, dtype=torch.bool)
            full[: min(S, links.shape[0]), : min(T, links.shape[1])] = links[:S, :T].cpu()
            return full
        pairs = [(int(s), int(t)) for s, t in (links.tolist() if isinstance(links, Tensor) else links)]
        outside = [(s, t) for s, t in pairs if not (0 <= s < S and 0 <= t < T)]
        if outside:
            raise ValueError(
                f"AlignmentAudit: row {row}'s batch[{key!r}] has links {outside[:5]} outside its {S} "
                f"source × {T} target words: give batch['source_words'] / ['target_words'] (each "
                "position's word, -1 for none) when tokens are not words."
            )
        full = torch.zeros(S, T, dtype=torch.bool)
        for s, t in pairs:
            full[s, t] = True
        return full
