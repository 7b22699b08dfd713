"""The audit's guard: run a measurement without leaving a trace on training, under the right precision."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, ContextManager, Iterator, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.rank_zero import rank_zero_warn

from lightning_xai.attribution.context import explanation_context, preserved_rng_state

__all__ = [
    "AuditPrecision",
    "PRECISION_OPTIONS",
    "audit_guard",
    "float32_weights",
    "precision_context",
    "reduced_precision",
]

#: values of the audit callbacks' ``precision`` argument
PRECISION_OPTIONS = ("auto", "trainer", "32")
_REDUCED = (torch.float16, torch.bfloat16)


@contextlib.contextmanager
def audit_guard(module: torch.nn.Module, seed: Optional[int] = None) -> Iterator[torch.Generator]:
    """Run an audit without leaving a trace on training.

    :func:`~lightning_xai.attribution.explanation_context` (the one implementation of the state-saving both
    share) saves and restores every submodule's ``training`` flag and every parameter's ``requires_grad`` and
    ``.grad``, puts the module in ``eval()``, leaves ``inference_mode`` and enables gradients (audits differentiate
    w.r.t. embeddings); :func:`~lightning_xai.attribution.context.preserved_rng_state` adds the python, numpy,
    torch and CUDA random states. Yields a private ``torch.Generator`` seeded with ``seed`` for the audit's own
    randomness.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout()).train()
        >>> state = torch.get_rng_state()
        >>> with audit_guard(net, seed=0) as gen:
        ...     _ = torch.rand(3)                 # consumes the global RNG ...
        ...     net.training, torch.is_grad_enabled()
        (False, True)
        >>> torch.equal(torch.get_rng_state(), state), net.training   # ... which is restored
        (True, True)
    """
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(seed)
    with preserved_rng_state(), explanation_context(module):
        yield generator


def reduced_precision(trainer: Optional["pl.Trainer"], module: torch.nn.Module) -> Optional[str]:
    """What runs in reduced precision — the trainer's ``precision`` (``"bf16-mixed"``, ``"16-true"``, …) or the
    module's float16/bfloat16 weights — in words, or ``None`` when everything runs in float32 (or float64).

    Example:
        >>> reduced_precision(None, torch.nn.Linear(2, 2)) is None
        True
        >>> reduced_precision(None, torch.nn.Linear(2, 2).bfloat16())
        'torch.bfloat16 weights'
    """
    setting = str(getattr(trainer, "precision", "32-true")) if trainer is not None else "32-true"
    if setting.startswith(("16", "bf16", "transformer-engine")):
        return f"Trainer(precision={setting!r})"
    dtypes = sorted({str(t.dtype) for t in _floating(module) if t.dtype in _REDUCED})
    return f"{', '.join(dtypes)} weights" if dtypes else None


def _floating(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from (t for t in itertools.chain(module.parameters(), module.buffers()) if t.is_floating_point())


@contextlib.contextmanager
def float32_weights(module: torch.nn.Module) -> Iterator[bool]:
    """Run with the module's float16/bfloat16 parameters and buffers in float32; on exit every one of them gets
    its original tensor back (the same storage, bit for bit). Yields whether anything was cast. Use it inside
    :func:`audit_guard`, which sets every ``.grad`` aside while the audit runs.

    Example:
        >>> net = torch.nn.Linear(2, 2).bfloat16()
        >>> storage = net.weight.data_ptr()
        >>> with float32_weights(net) as cast:
        ...     cast, net.weight.dtype
        (True, torch.float32)
        >>> net.weight.data_ptr() == storage, net.weight.dtype
        (True, torch.bfloat16)
    """
    saved = [(t, t.data) for t in _floating(module) if t.dtype in _REDUCED]
    try:
        for tensor, data in saved:
            tensor.data = data.float()
        yield bool(saved)
    finally:
        for tensor, data in saved:
            tensor.data = data


@contextlib.contextmanager
def _float32_context(device: torch.device) -> Iterator[None]:
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # "*-true" precision plugins set a half default dtype
    try:
        with torch.autocast(device_type=device.type, enabled=False):
            yield
    finally:
        torch.set_default_dtype(default)


def precision_context(trainer: "pl.Trainer", device: torch.device, precision: str) -> Any:
    """The context of the audit's forward passes: the trainer's (autocast for ``*-mixed``) for ``"trainer"``
    and ``"auto"`` (which switches to float32 per map, see :class:`~lightning_xai.callbacks.base.AuditCallback`)
    or, for ``"32"``, autocast disabled and a float32 default dtype, so maps of float32 weights are computed in
    float32.

    Example:
        >>> with precision_context(None, torch.device("cpu"), "32"):
        ...     torch.is_autocast_enabled("cpu")
        False
    """
    if precision == "32":
        return _float32_context(device)
    return trainer.precision_plugin.forward_context()


class AuditPrecision:
    """The precision policy of one audit callback (its ``precision`` argument, see
    :class:`~lightning_xai.callbacks.base.AuditCallback`).

    ``"auto"`` (the default): under reduced precision the precision-sensitive maps (their method's
    :class:`~lightning_xai.attribution.MethodRecord` says ``precision_sensitive``, or the whole audit is, as
    erasure) are computed in float32 — under autocast (``*-mixed``) those maps run with autocast off; with float16/bfloat16 weights
    (``*-true``, or a model cast by the user) the whole audit runs on float32 copies of the weights, the
    originals put back bit for bit afterwards — and it says so once. ``"trainer"``: every map under the trainer's
    precision. ``"32"``: every map in float32 (the weights cast as for ``"auto"``).

    Example:
        >>> policy = AuditPrecision("AttentionAudit", "auto")
        >>> with policy.audit(None, torch.nn.Linear(2, 2)) as context:
        ...     context
        'trainer'
    """

    def __init__(self, owner: str, precision: str) -> None:
        self.owner, self.precision = owner, precision
        self._float32_maps: Optional[torch.device] = None
        self._reduced: Optional[str] = None
        self._warned = False

    @contextlib.contextmanager
    def audit(self, trainer: Optional["pl.Trainer"], module: torch.nn.Module) -> Iterator[str]:
        """Around one audit (inside :func:`audit_guard`): yields the :func:`precision_context` to run it under."""
        reduced = None if self.precision == "trainer" else reduced_precision(trainer, module)
        if reduced is None:
            yield self.precision if self.precision == "32" else "trainer"
            return
        with float32_weights(module) as cast:
            if self.precision == "auto" and cast:
                self._say(reduced, cast)
            self._float32_maps = None if cast or self.precision == "32" else _device(module)
            self._reduced = reduced
            try:
                yield "32" if cast or self.precision == "32" else "trainer"
            finally:
                self._float32_maps = None

    def switches(self, sensitive: bool) -> bool:
        """Whether :meth:`maps` changes the precision for a ``sensitive`` map now (float32 under ``"auto"``
        autocast): what runs inside it then differs from the prediction step's precision."""
        return self._float32_maps is not None and sensitive

    def maps(self, name: str, sensitive: bool) -> ContextManager[Any]:
        """The context of computing map ``name``: float32 under ``"auto"`` autocast when ``sensitive`` (the map's
        method record says ``precision_sensitive``, or the whole audit is)."""
        if self._float32_maps is None or not sensitive:
            return contextlib.nullcontext()
        self._say(str(self._reduced), False, name)  # said when a map is first switched, not for audits without one
        return _float32_context(self._float32_maps)

    def _say(self, reduced: str, cast: bool, name: str = "") -> None:
        if self._warned:
            return
        self._warned = True
        how = (
            "every map is computed on float32 copies of the weights (put back bit for bit after the audit)"
            if cast
            else f"the precision-sensitive maps (here {name}; see precision_sensitive= of "
            "lightning_xai.attribution.register_method) are computed in float32 (autocast off for them)"
        )
        rank_zero_warn(
            f"{self.owner}: the model runs in reduced precision ({reduced}); {how}, because "
            "leave-one-out, erasure and integrated-gradient maps change beyond the noise in bfloat16/"
            f"float16. Pass {self.owner}(precision='trainer') to audit in the trainer's precision "
            "instead (or precision='32' for every map in float32)."
        )


def _device(module: torch.nn.Module) -> torch.device:
    return next((p.device for p in module.parameters()), torch.device("cpu"))
