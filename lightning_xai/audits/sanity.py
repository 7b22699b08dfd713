"""Sanity checks for saliency methods: do they explain the *model*, and only the model?

* :func:`input_invariance` — Kindermans et al. (2019), "The (un)reliability of saliency methods": every
  embedding is shifted by a constant vector ``c`` and the first layer's bias is compensated, so the shifted
  model computes exactly the same function of the tokens. A method *passes* when its map is unchanged.
  Gradients, attention and leave-one-out pass; gradient×input, zero-baseline Integrated Gradients and LRP
  (which multiply by the input) fail; IG with the pad-token baseline passes because the baseline moves
  with the inputs.
* :func:`model_randomization` — Adebayo et al. (2018), "Sanity checks for saliency maps": layers are
  re-initialised from the output down (``cascading``) or one at a time (``independent``); a method that
  explains the model must produce maps that change, i.e. a rank correlation (Kendall τ-b per example over
  its real tokens) with the original map near 0.
* :func:`completeness` — Integrated Gradients' completeness (Σ attributions = F(x) − F(x′)) at several step
  counts, and LRP's conservation (Σ relevance = target logit) with and without bias absorption.

Every check returns a :class:`SanityTable` (tidy rows, ``to_markdown()``); :func:`run_sanity_checks` runs
them all (the :class:`~lightning_xai.callbacks.sanity.SanityCheck` callback calls it).
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, as_explainable
from lightning_xai.attribution import attribute, explanation_context, predicted_class
from lightning_xai.models.encoders import LSTMEncoder, MLPEncoder

__all__ = ["DEFAULT_INVARIANCE_METHODS", "DEFAULT_RANDOMIZATION_METHODS", "MethodSpec", "SanityTable",
           "completeness", "input_invariance", "kendall_tau_b", "model_randomization", "run_sanity_checks",
           "shifted_model"]

MethodSpec = Union[str, Tuple[str, str, Mapping[str, Any]]]
"""A method name, or ``(label, method, options)`` to run one method with several option sets."""

DEFAULT_INVARIANCE_METHODS: Tuple[MethodSpec, ...] = (
    "attention",
    "gradient",
    "grad_x_input",
    ("integrated_gradients (zero baseline)", "integrated_gradients", {"baseline": "zero", "n_steps": 32}),
    ("integrated_gradients (pad baseline)", "integrated_gradients", {"baseline": "pad", "n_steps": 32}),
    "leave_one_out",
    "lrp",
)
DEFAULT_RANDOMIZATION_METHODS: Tuple[MethodSpec, ...] = (
    "attention",
    "gradient",
    "grad_x_input",
    ("integrated_gradients", "integrated_gradients", {"n_steps": 32}),
    "leave_one_out",
    "lrp",
)


@dataclass
class SanityTable:
    """Result of a sanity check: a tidy table, one row per (method[, stage]).

    Attributes:
        check: the check's name.
        rows: one dict per row; every row has the same keys (``columns``).
        notes: how to read the table (thresholds, what passing means).
        per_example: ``{key: [B] tensor}`` the per-example values behind the rows (keys like
            ``"gradient/relative_change"`` or ``"cascading/encoder/lrp/tau"``), for callbacks that aggregate
            many batches.

    Example:
        >>> table = SanityTable("demo", [{"method": "gradient", "passes": True}])
        >>> print(table.to_markdown())
        | method | passes |
        |---|---|
        | gradient | True |
        >>> table.row(method="gradient")["passes"]
        True
    """

    check: str
    rows: List[Dict[str, Any]]
    notes: str = ""
    columns: List[str] = field(default_factory=list)
    per_example: Dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.columns:
            seen: Dict[str, None] = {}
            for row in self.rows:
                for key in row:
                    seen.setdefault(key, None)
            self.columns = list(seen)

    def column(self, name: str) -> List[Any]:
        """The values of one column, in row order."""
        if name not in self.columns:
            raise KeyError(f"No column {name!r}; columns: {self.columns}.")
        return [row.get(name) for row in self.rows]

    def row(self, **match: Any) -> Dict[str, Any]:
        """The single row whose values equal ``match`` (e.g. ``row(method="gradient", stage="encoder")``)."""
        found = [row for row in self.rows if all(row.get(k) == v for k, v in match.items())]
        if len(found) != 1:
            raise KeyError(f"{len(found)} rows of {self.check!r} match {match}; rows: "
                           f"{[{c: r.get(c) for c in self.columns[:2]} for r in self.rows]}.")
        return found[0]

    def to_markdown(self, digits: int = 3) -> str:
        """A GitHub-flavoured markdown table (floats rounded to ``digits``)."""

        def fmt(value: Any) -> str:
            if isinstance(value, float):
                return "nan" if math.isnan(value) else f"{value:.{digits}g}" if abs(value) < 1e-3 and value else \
                    f"{value:.{digits}f}"
            return str(value)

        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(fmt(row.get(c)) for c in self.columns) + " |" for row in self.rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"{self.check}\n{self.to_markdown()}" + (f"\n{self.notes}" if self.notes else "")


# --- helpers -----------------------------------------------------------------------------------------------
def kendall_tau_b(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """Per-row Kendall τ-b between ``a`` and ``b`` ``[B, T]`` over the positions where ``mask`` is True.

    ``nan`` for rows with fewer than two tokens or where either map is constant (τ-b is undefined there).

    Example:
        >>> a = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
        >>> kendall_tau_b(a, torch.tensor([[3.0, 2.0, 1.0, 9.0]]), torch.tensor([[True, True, True, False]]))
        tensor([-1.])
    """
    dtype = a.dtype if a.is_floating_point() else torch.get_default_dtype()
    a, b = a.detach().double(), b.detach().double()
    pair = mask.unsqueeze(2) & mask.unsqueeze(1)
    pair = pair & torch.ones_like(pair).triu(diagonal=1)
    sa = torch.sign(a.unsqueeze(2) - a.unsqueeze(1)) * pair
    sb = torch.sign(b.unsqueeze(2) - b.unsqueeze(1)) * pair
    concord = (sa * sb).sum((1, 2))
    denom = torch.sqrt((sa != 0).sum((1, 2)).double() * (sb != 0).sum((1, 2)).double())
    tau = torch.where(denom > 0, concord / denom.clamp_min(1e-300), torch.full_like(concord, float("nan")))
    return tau.to(dtype)


def _slug(label: str) -> str:
    return "_".join(label.replace("(", " ").replace(")", " ").replace("+", "").split())


def _specs(methods: Iterable[MethodSpec]) -> List[Tuple[str, str, Dict[str, Any]]]:
    out = []
    for spec in methods:
        if isinstance(spec, str):
            out.append((spec, spec, {}))
        elif isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[0], str) and isinstance(spec[2], Mapping):
            out.append((spec[0], spec[1], dict(spec[2])))
        else:
            raise TypeError(f"A method must be a name or a (label, method, options) triple; got {spec!r}.")
    if not out:
        raise ValueError("No methods given; pass method names such as 'gradient' or 'grad_x_input'.")
    return out


def _copy_model(model: nn.Module) -> nn.Module:
    """A deep copy that does not drag a Lightning Trainer along."""
    trainer = getattr(model, "_trainer", None)
    if trainer is not None:
        model._trainer = None
    try:
        return copy.deepcopy(model)
    finally:
        if trainer is not None:
            model._trainer = trainer


def _maps(model: Any, batch: Batch, specs: Sequence[Tuple[str, str, Dict[str, Any]]], target: Tensor,
          skip_unsupported: bool) -> Dict[str, Optional[Tensor]]:
    maps: Dict[str, Optional[Tensor]] = {}
    for label, method, options in specs:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # IG's completeness warning: completeness() reports it
                result = attribute(model, batch, method, target=target, **options)
        except ValueError as error:
            if skip_unsupported and method == "lrp" and "LRP does not support" in str(error):
                maps[label] = None
                continue
            raise
        maps[label] = (result[0] if isinstance(result, tuple) else result).detach()
    return maps


def _embedding_module(model: Any) -> nn.Embedding:
    embedding = getattr(model, "embedding", None)
    if not isinstance(embedding, nn.Embedding):
        raise ValueError(f"{type(model).__name__} has no nn.Embedding called 'embedding'; the input-invariance "
                         "check shifts that table. Supported: AttentionClassifier (encoder 'lstm', 'bilstm', "
                         "'ortho_lstm', 'ortho_bilstm' or 'mlp').")
    return embedding


def _compensate(encoder: nn.Module, shift: Tensor) -> None:
    """Subtract ``W shift`` from the bias of every layer that reads the embeddings."""
    def fix(weight: Tensor, bias: Optional[Tensor], what: str) -> None:
        if bias is None:
            raise ValueError(f"The {what} has no bias, so a shift of its input cannot be compensated.")
        bias.sub_(weight @ shift.to(weight))

    if isinstance(encoder, LSTMEncoder):
        rnn = encoder.rnn
        for suffix in ("", "_reverse") if rnn.bidirectional else ("",):
            fix(getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"bias_ih_l0{suffix}"), "LSTM")
    elif isinstance(encoder, MLPEncoder):
        fix(encoder.proj.weight, encoder.proj.bias, "MLP encoder")
    elif isinstance(getattr(encoder, "cells", None), nn.ModuleList) and all(
            isinstance(cell, nn.LSTMCell) for cell in encoder.cells):
        for cell in encoder.cells:
            fix(cell.weight_ih, cell.bias_ih, "LSTM cell")
    else:
        raise ValueError(f"Cannot compensate an embedding shift in {type(encoder).__name__}: supported encoders are "
                         "LSTMEncoder ('lstm', 'bilstm'), OrthogonalLSTMEncoder ('ortho_lstm', 'ortho_bilstm') and "
                         "MLPEncoder ('mlp'). The CNN zero-pads its borders, so a shifted input is not a bias "
                         "change there.")


def shifted_model(model: nn.Module, shift: Union[float, Tensor]) -> nn.Module:
    """A copy of ``model`` whose embeddings are all shifted by ``shift`` and whose first layer compensates it.

    Every row of the embedding table (the pad row too, so a pad-token baseline moves with the inputs) gets
    ``+ shift``; the layer reading the embeddings gets ``b ← b − W shift``. The copy computes the same logits.

    Args:
        model: an AttentionClassifier-style model (``embedding`` + ``encoder``).
        shift: a ``[E]`` vector, or a float used for every dimension.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> other = shifted_model(model, 0.5)
        >>> torch.allclose(other(batch).logits, model(batch).logits, atol=1e-5)
        True
        >>> torch.allclose(other.embed(batch), model.embed(batch) + 0.5)
        True
    """
    embedding = _embedding_module(model)
    dim = embedding.weight.shape[1]
    vector = torch.full((dim,), float(shift)) if not isinstance(shift, Tensor) else shift.detach().flatten()
    if vector.shape != (dim,):
        raise ValueError(f"shift must be a float or a [{dim}] vector (the embedding size); got shape "
                         f"{tuple(vector.shape)}.")
    if not torch.isfinite(vector).all():
        raise ValueError("shift must be finite.")
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, nn.Module):
        raise ValueError(f"{type(model).__name__} has no 'encoder' module whose bias could compensate the shift.")
    other = _copy_model(model)
    vector = vector.to(embedding.weight)
    with torch.no_grad():
        other.embedding.weight.add_(vector)
        _compensate(other.encoder, vector)
    return other


def _relative_change(before: Tensor, after: Tensor, mask: Tensor) -> Tuple[float, float, Tensor]:
    diff = ((after - before) * mask).double()
    base = (before * mask).double()
    per_row = diff.norm(dim=1) / base.norm(dim=1).clamp_min(1e-30)
    return float(diff.abs().max()), float(diff.norm() / base.norm().clamp_min(1e-30)), per_row


# --- the checks --------------------------------------------------------------------------------------------
def input_invariance(
    model: Any,
    batch: Batch,
    methods: Iterable[MethodSpec] = DEFAULT_INVARIANCE_METHODS,
    shift: Optional[Union[float, Tensor]] = None,
    *,
    tolerance: float = 1e-3,
    seed: int = 0,
) -> SanityTable:
    """Kindermans et al.'s input-invariance check.

    Args:
        model: an AttentionClassifier-style model (see :func:`shifted_model`).
        batch: a batch dict.
        methods: names or ``(label, method, options)`` triples for :func:`~lightning_xai.attribution.attribute`.
        shift: the constant vector ``c`` (``[E]`` or a float); default: a fixed random vector (``seed``) with
            the embedding table's per-coordinate standard deviation, i.e. as large as the embeddings themselves.
        tolerance: a method passes when ``‖map' − map‖ / ‖map‖ ≤ tolerance`` over the real tokens.
        seed: seed of the default shift.

    Returns:
        rows ``method, passes, relative_change, max_abs_change, tau`` (mean per-example Kendall τ-b between
        the two maps), after a first row ``model (logits)`` showing that the shifted model is the same function.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> table = input_invariance(model, batch, ["gradient", "grad_x_input"])
        >>> table.row(method="gradient")["passes"], table.row(method="grad_x_input")["passes"]
        (True, False)
    """
    model = as_explainable(model)
    specs = _specs(methods)
    embedding = _embedding_module(model)
    if shift is None:
        generator = torch.Generator().manual_seed(seed)
        scale = float(embedding.weight.detach()[1:].std()) if embedding.weight.shape[0] > 1 else 1.0
        shift = torch.randn(embedding.weight.shape[1], generator=generator, dtype=torch.float64) * scale
    other = shifted_model(model, shift)
    mask = model.token_mask(batch)
    target = predicted_class(model, batch)
    with explanation_context(model, batch) as clean, torch.no_grad():
        logits = model.forward_from_embeddings(model.embed(clean), clean).logits
    with explanation_context(other, batch) as clean, torch.no_grad():
        logits_shifted = other.forward_from_embeddings(other.embed(clean), clean).logits
    logit_change = (logits_shifted - logits).abs().max().item()
    logit_rel = logit_change / max(logits.abs().max().item(), 1e-30)
    rows = [{"method": "model (logits)", "passes": logit_rel <= tolerance, "relative_change": logit_rel,
             "max_abs_change": logit_change, "tau": float("nan")}]
    before = _maps(model, batch, specs, target, skip_unsupported=True)
    after = _maps(other, batch, specs, target, skip_unsupported=True)
    per_example: Dict[str, Tensor] = {}
    for label, _, _ in specs:
        if before[label] is None:
            continue
        worst, relative, per_row = _relative_change(before[label], after[label], mask)
        tau = kendall_tau_b(before[label], after[label], mask)
        rows.append({"method": label, "passes": relative <= tolerance, "relative_change": relative,
                     "max_abs_change": worst, "tau": float(tau.nanmean()) if (~tau.isnan()).any() else float("nan")})
        per_example[f"{_slug(label)}/relative_change"] = per_row.cpu()
        per_example[f"{_slug(label)}/passes"] = (per_row <= tolerance).double().cpu()
    notes = (f"Embeddings shifted by a constant vector (norm {float(torch.as_tensor(shift).norm()):.3g}); first-layer "
             f"bias compensated. A method passes when its map changes by at most {tolerance:g} (relative L2).")
    return SanityTable("input_invariance", rows, notes, per_example=per_example)


def _default_layers(model: Any) -> List[str]:
    names = [name for name in ("classifier", "attention", "encoder", "embedding")
             if isinstance(getattr(model, name, None), nn.Module)]
    if len(names) < 2:
        raise ValueError(f"{type(model).__name__} has no classifier/attention/encoder/embedding modules; pass "
                         "layers=[...] with its module names ordered from the output to the input.")
    return names


def _reinitialize(module: nn.Module, generator_seed: int) -> bool:
    """Re-initialise every sub-module that knows how; True if any parameter changed."""
    changed = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(generator_seed)
        for sub in module.modules():
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset) and any(True for _ in sub.parameters(recurse=False)):
                reset()
                changed = True
    return changed


def model_randomization(
    model: Any,
    batch: Batch,
    methods: Iterable[MethodSpec] = DEFAULT_RANDOMIZATION_METHODS,
    *,
    mode: str = "cascading",
    layers: Optional[Sequence[str]] = None,
    seed: int = 0,
) -> SanityTable:
    """Adebayo et al.'s model-parameter randomisation test.

    Args:
        model: any explainable model with named sub-modules.
        batch: a batch dict.
        methods: as in :func:`input_invariance`.
        mode: ``"cascading"`` (re-initialise layers cumulatively from the output down) or ``"independent"``
            (one layer at a time, the others trained).
        layers: module names ordered from the output to the input; default for the reference models:
            ``classifier, attention, encoder, embedding`` (those that exist).
        seed: seed of the re-initialisation (each layer ``seed + its position``).

    Returns:
        rows ``stage, method, tau, tau_std, flipped`` — ``tau``: mean per-example Kendall τ-b between the
        original map and the map of the randomised model (same target class), ``flipped``: fraction of
        predictions that changed. A method that depends on the parameters has ``tau`` near 0 at the last
        cascading stage.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6, 7]]), "mask": torch.ones(1, 5, dtype=torch.bool)}
        >>> table = model_randomization(model, batch, ["gradient"])
        >>> table.column("stage")
        ['classifier', '+attention', '+encoder', '+embedding']
    """
    model = as_explainable(model)
    if mode not in ("cascading", "independent"):
        raise ValueError(f"mode must be 'cascading' or 'independent', got {mode!r}.")
    specs = _specs(methods)
    names = list(layers) if layers is not None else _default_layers(model)
    for name in names:
        if not isinstance(_get_module(model, name), nn.Module):
            raise ValueError(f"{type(model).__name__} has no sub-module {name!r}; layers must name modules "
                             f"(e.g. {[n for n, _ in model.named_children()]}).")
    mask = model.token_mask(batch)
    target = predicted_class(model, batch)
    original = _maps(model, batch, specs, target, skip_unsupported=True)
    rows = []
    per_example: Dict[str, Tensor] = {}
    randomized = _copy_model(model)
    for position, name in enumerate(names):
        if mode == "independent":
            randomized = _copy_model(model)
        changed = _reinitialize(_get_module(randomized, name), seed + position)
        stage = name if mode == "independent" or position == 0 else f"+{name}"
        if not changed:
            continue
        flipped = float((predicted_class(randomized, batch) != target).double().mean())
        after = _maps(randomized, batch, specs, target, skip_unsupported=True)
        for label, _, _ in specs:
            if original[label] is None:
                continue
            tau = kendall_tau_b(original[label], after[label], mask)
            valid = tau[~tau.isnan()]
            rows.append({"stage": stage, "method": label,
                         "tau": float(valid.mean()) if valid.numel() else float("nan"),
                         "tau_std": float(valid.std()) if valid.numel() > 1 else float("nan"),
                         "flipped": flipped})
            per_example[f"{mode}/{_slug(stage)}/{_slug(label)}/tau"] = tau.double().cpu()
    notes = (f"{mode} re-initialisation ({', '.join(names)}); tau = mean per-example Kendall tau-b to the "
             "trained model's map over real tokens, same target class. Near 0: the map depends on the weights.")
    return SanityTable(f"model_randomization ({mode})", rows, notes, per_example=per_example)


def _get_module(model: Any, dotted: str) -> Optional[nn.Module]:
    module = model
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module if isinstance(module, nn.Module) else None


def completeness(
    model: Any,
    batch: Batch,
    n_steps: Sequence[int] = (8, 32, 128),
    *,
    baseline: str = "zero",
    tolerance: float = 0.05,
    lrp_eps: float = 1e-6,
) -> SanityTable:
    """Completeness of Integrated Gradients and conservation of LRP.

    For IG (probability of the predicted class, Gauss–Legendre) the error is ``|Σ attr − (F(x) − F(x′))|``
    relative to ``|F(x) − F(x′)|``; for LRP ``|Σ R − logit|`` relative to ``|logit|`` (``bias_factor`` 1:
    conserved by construction, 0: biases absorb their share — reported to show how much).

    Returns:
        rows ``method, setting, mean_rel_error, max_rel_error, passes`` (max relative error ≤ ``tolerance``).

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> table = completeness(model, batch, n_steps=(16,))
        >>> table.row(method="integrated_gradients")["passes"], table.row(setting="bias_factor=1")["passes"]
        (True, True)
    """
    model = as_explainable(model)
    rows = []
    per_example: Dict[str, Tensor] = {}
    for steps in n_steps:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scores, delta = attribute(model, batch, "integrated_gradients", n_steps=int(steps), baseline=baseline,
                                      return_convergence_delta=True)
        gap = (scores.sum(1) - delta).abs().double()  # Σattr − delta = F(x) − F(x′)
        rel = delta.abs().double() / gap.clamp_min(1e-12)
        rows.append({"method": "integrated_gradients", "setting": f"n_steps={int(steps)}, baseline={baseline}",
                     "mean_rel_error": float(rel.mean()), "max_rel_error": float(rel.max()),
                     "passes": bool(rel.max() <= tolerance)})
        per_example[f"integrated_gradients_{int(steps)}_steps/relative_error"] = rel.detach().cpu()
    try:
        target = predicted_class(model, batch)
        with explanation_context(model, batch) as clean, torch.no_grad():
            logit = model.forward_from_embeddings(model.embed(clean), clean).logits.gather(1, target[:, None])[:, 0]
        for factor in (1.0, 0.0):
            _, delta = attribute(model, batch, "lrp", target=target, eps=lrp_eps, bias_factor=factor,
                                 return_convergence_delta=True)
            rel = delta.abs().double() / logit.abs().double().clamp_min(1e-12)
            rows.append({"method": "lrp", "setting": f"bias_factor={factor:g}", "mean_rel_error": float(rel.mean()),
                         "max_rel_error": float(rel.max()), "passes": bool(rel.max() <= tolerance)})
            per_example[f"lrp_bias_factor_{factor:g}/relative_error"] = rel.detach().cpu()
    except ValueError as error:
        if "LRP does not support" not in str(error):
            raise
    notes = (f"Relative error of IG's completeness (|delta| / |F(x) - F(x')|) and of LRP's conservation "
             f"(|sum R - logit| / |logit|); passes when the largest is <= {tolerance:g}. LRP with bias_factor=0 "
             "is not meant to conserve: the biases absorb relevance.")
    return SanityTable("completeness", rows, notes, per_example=per_example)


def run_sanity_checks(model: Any, batch: Batch, *, checks: Sequence[str] = ("input_invariance", "model_randomization",
                                                                             "completeness"),
                      **options: Any) -> Dict[str, SanityTable]:
    """Run the named checks (default: all three) on one batch; ``options`` go to the checks by name prefix
    (``input_invariance_methods=...``, ``model_randomization_mode=...``, ``completeness_n_steps=...``).

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> sorted(run_sanity_checks(model, batch, checks=["completeness"], completeness_n_steps=(8,)))
        ['completeness']
    """
    functions = {"input_invariance": input_invariance, "model_randomization": model_randomization,
                 "completeness": completeness}
    unknown = [c for c in checks if c not in functions]
    if unknown:
        raise ValueError(f"Unknown sanity check(s) {unknown}; choose from {sorted(functions)}.")
    per_check = {name: {key[len(name) + 1:]: value for key, value in options.items() if key.startswith(name + "_")}
                 for name in checks}
    extra = sorted(set(options) - {f"{name}_{key}" for name, kwargs in per_check.items() for key in kwargs})
    if extra:
        raise TypeError(f"Options {extra} match no check that runs; prefix them with one of {list(checks)}.")
    return {name: functions[name](model, batch, **per_check[name]) for name in checks}
