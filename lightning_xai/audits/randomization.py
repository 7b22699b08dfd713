"""Adebayo et al. (2018), "Sanity checks for saliency maps": the model-parameter randomisation test.

Layers are re-initialised from the output down (``cascading``) or one at a time (``independent``); a method that
explains the model must produce maps that change: a rank correlation (Kendall τ-b per example over its real
tokens, :func:`~lightning_xai.metrics.functional.kendall_tau`) with the original map near 0.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, as_explainable
from lightning_xai.attribution import predicted_class
from lightning_xai.audits.sanity_table import MethodSpec, SanityTable, _copy_model, _maps, _slug, _specs
from lightning_xai.metrics.functional.agreement import kendall_tau

__all__ = ["DEFAULT_RANDOMIZATION_METHODS", "model_randomization"]

DEFAULT_RANDOMIZATION_METHODS: Tuple[MethodSpec, ...] = (
    "attention",
    "gradient",
    "grad_x_input",
    ("integrated_gradients", "integrated_gradients", {"n_steps": 32}),
    "leave_one_out",
    "lrp",
)


def _default_layers(model: Any) -> List[str]:
    own = getattr(model, "randomization_layers", None)  # a model that knows its cascade (HuggingFaceAdapter)
    if callable(own):
        return list(own())
    names = [
        name
        for name in ("classifier", "attention", "encoder", "embedding")
        if isinstance(getattr(model, name, None), nn.Module)
    ]
    if len(names) < 2:
        raise ValueError(
            f"{type(model).__name__} has no classifier/attention/encoder/embedding modules; pass "
            "layers=[...] with its module names ordered from the output to the input."
        )
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
        layers: module names ordered from the output to the input; default: the model's own
            ``randomization_layers()`` where it has one (a ``transformers`` model through
            :class:`~lightning_xai.adapters.HuggingFaceAdapter`: its head, pooler or final norm, each layer from the
            top, its embeddings), else for the reference models ``classifier, attention, encoder, embedding``
            (those that exist).
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
            raise ValueError(
                f"{type(model).__name__} has no sub-module {name!r}; layers must name modules "
                f"(e.g. {[n for n, _ in model.named_children()]})."
            )
    mask = model.token_mask(batch)
    target = predicted_class(model, batch)
    original = _maps(model, batch, specs, target, skip_unsupported=True)
    rows = []
    per_example: Dict[str, Tensor] = {}
    randomized = _copy_model(model)
    for position, name in enumerate(names):
        if mode == "independent":
            randomized = _copy_model(model)
        module = _get_module(randomized, name)
        assert module is not None  # checked on the model above; the copy has the same sub-modules
        changed = _reinitialize(module, seed + position)
        stage = name if mode == "independent" or position == 0 else f"+{name}"
        if not changed:
            continue
        flipped = float((predicted_class(randomized, batch) != target).double().mean())
        after = _maps(randomized, batch, specs, target, skip_unsupported=True)
        for label, _, _ in specs:
            map_before, map_after = original[label], after[label]
            if map_before is None:
                continue
            assert map_after is not None  # the randomised copy has the model's class: LRP supports both or neither
            tau = kendall_tau(map_before, map_after, mask)[0]
            valid = tau[~tau.isnan()]
            rows.append(
                {
                    "stage": stage,
                    "method": label,
                    "tau": float(valid.mean()) if valid.numel() else float("nan"),
                    "tau_std": float(valid.std()) if valid.numel() > 1 else float("nan"),
                    "flipped": flipped,
                }
            )
            per_example[f"{mode}/{_slug(stage)}/{_slug(label)}/tau"] = tau.double().cpu()
    notes = (
        f"{mode} re-initialisation ({', '.join(names)}); tau = mean per-example Kendall tau-b to the "
        "trained model's map over real tokens, same target class. Near 0: the map depends on the weights."
    )
    return SanityTable(f"model_randomization ({mode})", rows, notes, per_example=per_example)


def _get_module(model: Any, dotted: str) -> Optional[nn.Module]:
    module = model
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module if isinstance(module, nn.Module) else None
