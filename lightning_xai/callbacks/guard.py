"""The audit's guard: run a measurement without leaving a trace on training, under the right precision."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import pytorch_lightning as pl
import torch

from lightning_xai.attribution.context import explanation_context, preserved_rng_state

__all__ = ["audit_guard", "precision_context"]


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


def precision_context(trainer: "pl.Trainer", device: torch.device, precision: str) -> Any:
    """The context of the audit's forward passes: the trainer's (autocast for ``*-mixed``) or, for ``"32"``,
    autocast disabled so maps are computed in float32.

    Example:
        >>> with precision_context(None, torch.device("cpu"), "32"):
        ...     torch.is_autocast_enabled("cpu")
        False
    """
    if precision == "32":
        return torch.autocast(device_type=device.type, enabled=False)
    return trainer.precision_plugin.forward_context()
