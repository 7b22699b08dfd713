"""Run explanations anywhere: inside ``trainer.validate``/``test`` (inference mode), training, or plain code."""

from __future__ import annotations

import random
import warnings
from contextlib import ExitStack, contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional

import numpy as np
import torch
from torch import Tensor, nn

from lightning_xai.adapters.sharding import sharding_restored, sharding_settled

__all__ = [
    "explanation_context",
    "clone_inference_tensors",
    "get_random_states",
    "preserved_rng_state",
    "set_random_states",
]


def get_random_states() -> Dict[str, Any]:
    """The python, numpy, torch and (initialised) CUDA random states, as types ``torch.load(weights_only=True)``
    reads (Lightning loads checkpoints that way): tuples, ints, floats, strings and tensors.

    Example:
        >>> states = get_random_states()
        >>> first = torch.rand(2), np.random.rand(), random.random()
        >>> set_random_states(states)
        >>> again = torch.rand(2), np.random.rand(), random.random()
        >>> torch.equal(again[0], first[0]), again[1:] == first[1:]
        (True, True)
    """
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    state = np.random.get_state()
    assert isinstance(state, tuple)  # the global RandomState is MT19937, whose legacy state is this tuple
    name, keys, pos, has_gauss, cached = state
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "cuda": torch.cuda.get_rng_state_all() if cuda else None,
    }


def set_random_states(states: Dict[str, Any]) -> None:
    """Restore states from :func:`get_random_states` (CUDA's only when as many devices are visible, else a warning)."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    elif cuda is not None:
        warnings.warn(
            f"{len(cuda)} CUDA random states were saved but "
            f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} devices are visible; the CUDA "
            "random stream is not restored.",
            RuntimeWarning,
            stacklevel=2,
        )


@contextmanager
def preserved_rng_state() -> Iterator[None]:
    """Save the python, numpy, torch and (initialised) CUDA random states; restore them on exit, also on error.

    :func:`explanation_context` touches no random number generator; audits that draw random numbers (baselines,
    random rankings, noise) nest it in this, so training's random stream continues as if they had not run.

    Example:
        >>> state = torch.get_rng_state()
        >>> with preserved_rng_state():
        ...     _ = torch.rand(3), np.random.rand(), random.random()
        >>> torch.equal(torch.get_rng_state(), state)
        True
    """
    states = get_random_states()
    try:
        yield
    finally:
        set_random_states(states)


def clone_inference_tensors(value: Any) -> Any:
    """Clone every inference tensor in ``value`` (nested dicts/lists/tuples) into an ordinary tensor.

    Tensors created under :func:`torch.inference_mode` cannot take part in autograd; Lightning's
    ``trainer.validate/test/predict`` hand such tensors to callbacks. Other values are returned as they are.
    Call it with inference mode disabled (as :func:`explanation_context` does).

    Example:
        >>> with torch.inference_mode():
        ...     batch = {"input_ids": torch.ones(1, 2, dtype=torch.long), "n": 3}
        >>> clone_inference_tensors(batch)["input_ids"].is_inference()
        False
    """
    if isinstance(value, Tensor):
        return value.clone() if value.is_inference() else value
    if isinstance(value, Mapping):
        return {k: clone_inference_tensors(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(clone_inference_tensors(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(clone_inference_tensors(v) for v in value)
    return value


def _modules(model: Any) -> List[nn.Module]:
    return list(model.modules()) if isinstance(model, nn.Module) else []


@contextmanager
def explanation_context(model: Any, batch: Optional[Any] = None, *, freeze_parameters: bool = False) -> Iterator[Any]:
    """Context in which a model can be explained, whatever the caller's autograd state.

    On entry it

    * disables :func:`torch.inference_mode` and enables gradients (Lightning runs ``validate``/``test``
      under inference mode, ``fit``'s validation under ``no_grad``);
    * clones the inference tensors of ``batch`` (the caller's batch is not modified) and yields the result
      (``None`` when no batch is given);
    * puts the model in ``eval()`` (no dropout: maps are deterministic);
    * sets every parameter's ``.grad`` to ``None`` and, with ``freeze_parameters=True``, switches off
      ``requires_grad`` so that only gradients w.r.t. inputs are built (faster, less memory);
    * on CUDA, disables cuDNN when the model has RNN layers (cuDNN's RNN backward only runs in train mode).

    On exit — also when an exception is raised — it restores the train/eval flag of every submodule, every
    parameter's ``requires_grad`` and its previous ``.grad`` (so gradients accumulated by a training step
    are untouched and no new ``.grad`` is left behind), and the caller's grad/inference mode; a model sharded
    with FSDP2 gets back the sharded parameters it held on entry
    (:func:`~lightning_xai.adapters.sharding.sharding_restored`). It touches no random number generator.

    Args:
        model: the (explainable) model; non-``nn.Module`` adapters are accepted, only modes of modules are
            tracked.
        batch: optional batch to make autograd-safe.
        freeze_parameters: turn off ``requires_grad`` on the parameters while inside.

    Yields:
        The batch with inference tensors cloned, or ``None``.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).train()
        >>> with torch.inference_mode():
        ...     batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        ...     with explanation_context(model, batch) as safe:
        ...         emb = model.embed(safe).detach().requires_grad_()
        ...         logit = model.forward_from_embeddings(emb, safe).logits[0, 1]
        ...         grad, = torch.autograd.grad(logit, emb)
        >>> grad.shape, model.training, model.embedding.weight.grad is None
        (torch.Size([1, 3, 8]), True, True)
    """
    modules = _modules(model)
    modes = [m.training for m in modules]
    params = list(model.parameters()) if isinstance(model, nn.Module) else []
    flags = [p.requires_grad for p in params]
    grads = [p.grad for p in params]
    has_rnn = any(isinstance(m, nn.RNNBase) for m in modules)
    on_cuda = any(p.is_cuda for p in params)
    with ExitStack() as stack:
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        if has_rnn and on_cuda:
            stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        stack.enter_context(sharding_settled())  # is_sharded walks the model once per explanation
        stack.enter_context(sharding_restored(model))  # exits after the flags below are restored
        try:
            for p in params:
                p.grad = None
                if freeze_parameters:
                    p.requires_grad_(False)
            for m in modules:
                m.training = False
            yield None if batch is None else clone_inference_tensors(batch)
        finally:
            for m, mode in zip(modules, modes):
                m.training = mode
            for p, flag, grad in zip(params, flags, grads):
                if p.requires_grad != flag:
                    p.requires_grad_(flag)
                p.grad = grad
