"""Pruthi et al. (2020): train attention to hide impermissible tokens."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput
from lightning_xai.losses._common import FiniteGuard, bool_batch_mask, check_weight, log_extra, require_finite
from lightning_xai.metrics.functional.plausibility import impermissible_mass

__all__ = ["DeceptionPenalty", "deception_penalty", "impermissible_mass"]

_REDUCTIONS = ("mean", "max")


def _neg_log_permissible(mass: Tensor, permissible: Optional[Tensor], eps: float) -> Tensor:
    """−log(p / (m + p)), p the permissible mass (``1 − m`` when not given), finite and with a nonzero gradient.

    Near m = 0 it is −log1p(−m / (m + p)) (precise for small m); near m = 1 it is log(m + p) − log p with p summed
    directly, not as 1 − m (which rounds to 0 in float32 while p is still 1e-7). p below ``eps``·(m + p) counts as
    ``eps``·(m + p) in the value (at most −log eps) but keeps the gradient of log p (a straight-through clamp): a
    clamp alone would make the gradient exactly 0 where the mass is highest, where the penalty matters most.
    """
    tiny = torch.finfo(mass.dtype).tiny
    if permissible is None:
        permissible, total = 1.0 - mass, torch.ones_like(mass)
    else:
        total = (mass + permissible).clamp_min(tiny)
    share = mass / total
    small = -torch.log1p(-share.clamp(max=0.5))
    kept = permissible + (torch.maximum(permissible, eps * total) - permissible).detach()
    large = torch.log(total) - torch.log(kept.clamp_min(tiny))
    return torch.where(share <= 0.5, small, large)


def _penalty(
    mass: Tensor,
    permissible: Optional[Tensor],
    weight: float,
    reduction: str,
    eps: float,
    dead: Optional[Tensor] = None,
    valid: Optional[Tensor] = None,
) -> Tensor:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}.")
    terms = _neg_log_permissible(mass, permissible, eps)
    if dead is not None:
        # rows without a permissible real token: the attention cannot lower their term, whose value is the
        # constant −log eps with a zero gradient; under "max" it hid every other row's gradient. They count 0,
        # like rows without impermissible tokens.
        terms = terms.masked_fill(dead.view(-1, *([1] * (terms.dim() - 1))).to(terms.device), 0.0)
    if valid is not None:  # a generator's target steps: the padding of rows with fewer steps is no term at all
        terms = terms[valid.to(terms.device).expand_as(terms)]
    if terms.numel() == 0:
        return mass.new_zeros(())
    return weight * (terms.mean() if reduction == "mean" else terms.max())


def deception_penalty(
    mass: Tensor,
    weight: float = 1.0,
    reduction: str = "mean",
    eps: float = 1e-6,
    *,
    permissible: Optional[Tensor] = None,
) -> Tensor:
    """Pruthi's penalty from impermissible attention masses ``mass`` (any shape, e.g. ``[B]`` or ``[B, heads]``).

    ``mean``: −λ·mean log(1 − m); ``max``: −λ·min log(1 − m) (the largest single penalty); λ = ``weight``.
    ``permissible``: the masses Σ_{j∉I} α_j summed directly (same shape as
    ``mass``; default 1 − m), which keeps 1 − m exact near m = 1; then the term is −log(p / (m + p)). Masses whose
    1 − m falls below ``eps`` count as 1 − eps in the value but keep a nonzero gradient.

    Raises:
        ValueError: a weight that is not a finite number >= 0, or a NaN or infinite mass.

    Example:
        >>> m = torch.tensor([0.0, 0.5])
        >>> deception_penalty(m, weight=1.0), deception_penalty(m, weight=1.0, reduction="max")
        (tensor(0.3466), tensor(0.6931))
    """
    weight = check_weight(weight, "deception_penalty")
    require_finite("deception_penalty", mass=mass, permissible=permissible)
    return _penalty(mass, permissible, weight, reduction, eps)


class DeceptionPenalty(FiniteGuard, nn.Module):
    """Pruthi et al.'s deception penalty R = −λ·log(1 − Σ_{i∈I} α_i) on the batch's ``impermissible`` tokens.

    Two kinds of attention are supported:

    * ``[B, T]`` token attention (``outputs.attention``, e.g. the BiLSTM): one mass per example;
      ``mean`` = −λ·mean_b log(1 − m_b), ``max`` = −λ·min_b log(1 − m_b).
    * multi-head ``outputs.raw_attentions`` (per layer ``[B, heads, T, T]``, e.g. BERT): the query row
      ``query`` (0 = [CLS]) of the chosen ``layers`` (default the last) and ``heads`` (default all); one mass
      a_{b,h} per example and head; ``mean`` = −λ·mean_{b,h} log(1 − a_{b,h}), ``max`` = −λ·min_{b,h}
      log(1 − a_{b,h}), as in Pruthi et al.'s BERT code. Several layers are pooled as extra heads.
    * a **generator**'s output (``outputs.target_steps`` set: a causal LM or an encoder–decoder through
      :class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`): every explained target step is
      penalised, as Pruthi et al. did on their seq2seq tasks: the step's query row (``extras["step_queries"]``) of
      the raw maps (decoder self-attention of a causal LM, cross-attention of an encoder–decoder), one mass per
      example, step and head; with ``source="attention"`` the step distributions ``extras["step_attention"]``
      ``[B, K, T]``, one mass per example and step. The steps a row does not have are no terms; ``query`` does not
      apply. ``batch["impermissible"]`` marks the source / prompt positions (``[B, T]`` over the keys).

    ``source="auto"`` uses ``raw_attentions`` when the output has them, else ``attention``. The mask is read
    from ``batch["impermissible"]`` (bool ``[B, T]``, aligned with the attention's key positions — for
    word-piece models the adapter provides the word-piece mask). Masses approaching 1 stay finite and keep their
    gradient (1 − m is the permissible mass summed directly, counted as at least ``eps`` in the value; see
    :func:`deception_penalty`); a batch with NaN or infinite attention gives a zero loss and a warning
    (:class:`~lightning_xai.losses._common.FiniteGuard`). Examples without any impermissible token contribute 0 and are
    counted in :attr:`empty_examples` (and logged as ``train/<name>_empty`` under a Trainer); so do rows without
    a permissible real token (every token of ``batch["mask"]`` impermissible: the attention cannot lower their
    term, and under ``"max"`` its constant −log eps hid every other row's gradient), with a ``RuntimeWarning``; the mean
    impermissible mass of the last batch is kept in :attr:`last_mass` and logged as ``train/<name>_mass``.

    Args:
        weight: λ, the penalty weight (Pruthi et al. use 0.1 and 1).
        reduction: ``"mean"`` or ``"max"``.
        layers: layer index or indices of ``raw_attentions`` (negative indices count from the end).
        heads: head indices to use (default all).
        query: query row of the multi-head maps; ``None`` (default) reads the row the classifier pools,
            ``outputs.extras["query_positions"]`` (each row's last real token for decoder classifiers), or row 0
            ([CLS]) when the output does not report it.
        source: ``"auto"``, ``"attention"`` or ``"raw"``.
        eps: clamp margin below mass 1.
        name: the logged name (``train/<name>``).

    Example:
        >>> import torch
        >>> from lightning_xai.adapters import ExplainOutput
        >>> penalty = DeceptionPenalty(weight=1.0)
        >>> out = ExplainOutput(logits=torch.zeros(1, 2), attention=torch.tensor([[0.5, 0.25, 0.25]]))
        >>> penalty(out, {"impermissible": torch.tensor([[True, False, False]])})
        tensor(0.6931)
    """

    def __init__(
        self,
        weight: float = 1.0,
        reduction: str = "mean",
        layers: Union[int, Sequence[int]] = -1,
        heads: Optional[Sequence[int]] = None,
        query: Optional[int] = None,
        source: str = "auto",
        eps: float = 1e-6,
        name: str = "deception",
    ) -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}.")
        if source not in ("auto", "attention", "raw"):
            raise ValueError(f"source must be 'auto', 'attention' or 'raw', got {source!r}.")
        weight = check_weight(weight, "DeceptionPenalty")
        if not 0 < eps < 1:
            raise ValueError(f"eps must lie in (0, 1), got {eps}.")
        self.weight = float(weight)
        self.reduction = reduction
        self.layers = [layers] if isinstance(layers, int) else list(layers)
        self.heads = None if heads is None else list(heads)
        self.query = query
        self.source = source
        self.eps = eps
        self.name = name
        self.empty_examples = 0
        self.seen_examples = 0
        self.last_mass: Optional[Tensor] = None

    def masses(self, outputs: ExplainOutput, batch: Batch) -> Tensor:
        """The impermissible masses the penalty is computed from: ``[B]`` or ``[B, heads·layers]``."""
        return self._masses(outputs, batch)[0]

    def _masses(self, outputs: ExplainOutput, batch: Batch) -> Tuple[Tensor, Tensor]:
        """The impermissible masses and the permissible ones (Σ_{j∉I} α_j, summed directly)."""
        return self._masses_and_steps(outputs, batch)[:2]

    def _masses_and_steps(self, outputs: ExplainOutput, batch: Batch) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """The masses, the permissible masses and, for a generator, which entries are real target steps."""
        impermissible = bool_batch_mask(
            batch,
            "impermissible",
            "DeceptionPenalty",
            "True at tokens whose attention is penalised; use a dataset with impermissible "
            "masks (sst_wiki, pronoun, occupation) or add the key in your collate function",
        )
        use_raw = self.source == "raw" or (self.source == "auto" and outputs.raw_attentions is not None)
        if outputs.target_steps is not None:
            attention, valid = self._step_rows(outputs, use_raw)
            return (*self._split(attention, impermissible), valid)
        if use_raw:
            if not outputs.raw_attentions:
                raise ValueError(
                    "source='raw' but the model output has no raw_attentions; use source='attention' "
                    "or an adapter that returns per-layer attention maps."
                )
            maps = []
            n_layers = len(outputs.raw_attentions)
            for layer in self.layers:
                if not -n_layers <= layer < n_layers:
                    raise IndexError(f"layer {layer} out of range for {n_layers} attention layers.")
                raw = outputs.raw_attentions[layer]
                if raw.dim() != 4:
                    raise ValueError(
                        f"raw_attentions[{layer}] has shape {tuple(raw.shape)}; expected [B, heads, T, T]."
                    )
                positions = (outputs.extras or {}).get("query_positions") if self.query is None else None
                if positions is not None:  # the pooled row of every example
                    rows = raw[torch.arange(raw.shape[0], device=raw.device), :, positions.to(raw.device)]
                else:
                    rows = raw[:, :, 0 if self.query is None else self.query, :]  # [B, heads, T]
                if self.heads is not None:
                    rows = rows[:, self.heads]
                maps.append(rows)
            attention = torch.cat(maps, dim=1)
        else:
            attention = outputs.attention
        return (*self._split(attention, impermissible), None)

    @staticmethod
    def _split(attention: Tensor, impermissible: Tensor) -> Tuple[Tensor, Tensor]:
        """(Σ_{i∈I} α_i, Σ_{j∉I} α_j) over the last dimension of ``attention`` ``[B, ..., T]``."""
        if impermissible.shape != (attention.shape[0], attention.shape[-1]):
            raise ValueError(
                f"batch['impermissible'] has shape {tuple(impermissible.shape)} but the attention "
                f"covers {(attention.shape[0], attention.shape[-1])} [B, T] positions; the mask must "
                "be aligned with the attention's key positions (word pieces for transformers)."
            )
        return (
            impermissible_mass(attention, impermissible, check=False),
            impermissible_mass(attention, ~impermissible, check=False),
        )

    def _step_rows(self, outputs: ExplainOutput, use_raw: bool) -> Tuple[Tensor, Tensor]:
        """A generator's rows: ``[B, K, heads·layers, T]`` raw rows (or ``[B, K, T]`` step distributions) and the
        real target steps ``[B, K, 1]`` (``[B, K]``)."""
        extras = outputs.extras or {}
        steps = outputs.target_steps
        assert steps is not None  # the caller checked
        if not use_raw:
            if "step_attention" not in extras:
                raise ValueError(
                    "DeceptionPenalty: a generator's output without extras['step_attention'] (each "
                    "target step's attention over the source); use HuggingFaceGenerationAdapter."
                )
            return extras["step_attention"], steps.bool()
        if not outputs.raw_attentions or "step_queries" not in extras:
            raise ValueError(
                "DeceptionPenalty: a generator's output without raw_attentions and "
                "extras['step_queries'] (each target step's query row); use source='attention' or "
                "HuggingFaceGenerationAdapter."
            )
        queries = extras["step_queries"]
        n_layers = len(outputs.raw_attentions)
        maps = []
        for layer in self.layers:
            if not -n_layers <= layer < n_layers:
                raise IndexError(f"layer {layer} out of range for {n_layers} attention layers.")
            raw = outputs.raw_attentions[layer]  # [B, heads, Q, T]
            rows = raw[torch.arange(raw.shape[0], device=raw.device)[:, None], :, queries.to(raw.device)]
            maps.append(rows if self.heads is None else rows[:, :, self.heads])  # [B, K, heads, T]
        return torch.cat(maps, dim=2), steps.bool()[:, :, None]

    def forward(self, outputs: ExplainOutput, batch: Batch, model: Any = None) -> Tensor:
        mass, permissible, valid = self._masses_and_steps(outputs, batch)
        empty = int((~batch["impermissible"].any(-1)).sum())
        self.empty_examples += empty
        self.seen_examples += int(batch["impermissible"].shape[0])
        self.last_mass = (mass if valid is None else mass[valid.expand_as(mass)]).detach().mean()
        real = batch.get("mask")
        real = real.bool() if isinstance(real, Tensor) and real.shape == batch["impermissible"].shape else True
        dead = ~(~batch["impermissible"].bool() & real).any(-1)  # no permissible real token
        if bool(dead.any()):
            warnings.warn(
                f"DeceptionPenalty: {int(dead.sum())} row(s) have no permissible real token (every token "
                "impermissible): the attention cannot lower their penalty, so they count 0 instead of "
                "the constant −log(eps) with a zero gradient.",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            dead = None
        value = self.finite_or_zero(
            _penalty(mass, permissible, self.weight, self.reduction, self.eps, dead, valid),
            model,
            impermissible_mass=mass,
            permissible_mass=permissible,
        )
        size = int(batch["impermissible"].shape[0])
        log_extra(model, f"train/{self.name}_mass", self.last_mass, size)
        log_extra(model, f"train/{self.name}_empty", float(empty), size)
        return value

    def extra_repr(self) -> str:
        return f"weight={self.weight}, reduction={self.reduction!r}, layers={self.layers}, heads={self.heads}"
