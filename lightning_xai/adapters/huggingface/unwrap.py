"""The ``transformers`` model inside what a user trains: PEFT, ``torch.compile``, DDP/FSDP wrappers taken off.

Users fine-tune a classifier wrapped several ways; each wrapper leaves the function of the model unchanged or
holds the model's own modules, so explanations read the ``transformers`` model inside:

* ``torch.compile`` — an ``OptimizedModule`` runs its ``_orig_mod`` (same parameters, same function);
* ``DistributedDataParallel`` / ``DataParallel`` / FSDP (``FullyShardedDataParallel``) — ``.module`` (for FSDP the
  parameters must be gathered where explanations run: ``use_orig_params=True`` and full parameters on the rank);
* PEFT (``peft.PeftModel``, recognised by ``get_base_model()`` and ``peft_config``) — LoRA, IA3 and the other
  adapter methods put their layers *inside* the ``transformers`` model (``lora_A``/``lora_B`` in the projections,
  ``ModulesToSaveWrapper`` around the head), so the model ``get_base_model()`` returns computes what the PEFT model
  does. Prompt learning (prefix, prompt or P-tuning) adds virtual tokens in the PEFT model's own forward, which
  the inner model never sees: refused by name (merge or use an adapter method).

Gradient checkpointing stays on the model; :func:`unchecked_layers` turns it off for the adapter's own passes only.
A checkpointed layer runs its forward a second time during ``backward``, after the adapter's pass has returned:
outside the adapter's recording attention (so on the model's own implementation, NaN on fully padded rows) and
outside any attention override, so the gradient would be that of another function.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Tuple

from torch import nn

from lightning_xai.adapters.protocol import ProtocolError

__all__ = ["Unwrapped", "unchecked_layers", "unwrap"]


@dataclass(frozen=True)
class Unwrapped:
    """What :func:`unwrap` found.

    Attributes:
        model: the innermost module (the ``transformers`` model when there is one).
        reference: the module whose forward defines the function the user trains: the PEFT model when there is
            one, else ``model`` (compile and data-parallel wrappers compute ``model``'s function).
        wrappers: the class names taken off, outermost first (empty for a bare model).
    """

    model: nn.Module
    reference: nn.Module
    wrappers: Tuple[str, ...]


def _parallel_types() -> Tuple[type, ...]:
    types = [nn.DataParallel, nn.parallel.DistributedDataParallel]
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        types.append(FullyShardedDataParallel)
    except ImportError:  # pragma: no cover - torch built without distributed
        pass
    return tuple(types)


def _compiled_type() -> Optional[type]:
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # pragma: no cover - torch without dynamo
        return None
    return OptimizedModule


def _is_peft(module: Any) -> bool:
    return callable(getattr(module, "get_base_model", None)) and isinstance(getattr(module, "peft_config", None), dict)


def _check_peft(module: Any) -> None:
    config = module.peft_config.get(getattr(module, "active_adapter", "default"))
    if config is not None and getattr(config, "is_prompt_learning", False):
        kind = getattr(getattr(config, "peft_type", None), "value", getattr(config, "peft_type", "prompt learning"))
        raise ProtocolError(
            f"{type(module).__name__} uses {kind} (prompt learning): its forward adds virtual tokens that the "
            "transformers model inside never sees, so explanations of that model would describe another function. "
            "Explain a PEFT model trained with an adapter method (LoRA, IA3, ...), whose layers live inside the "
            "transformers model."
        )


def unwrap(module: nn.Module) -> Unwrapped:
    """Take ``torch.compile``, data-parallel and PEFT wrappers off ``module`` (see the module docstring).

    Raises:
        ProtocolError: a PEFT model using prompt learning.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> net = BertForSequenceClassification(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
        ...                                                num_attention_heads=2, intermediate_size=8))
        >>> found = unwrap(torch.compile(net))
        >>> found.model is net, found.reference is net, found.wrappers
        (True, True, ('OptimizedModule',))
    """
    parallel, compiled = _parallel_types(), _compiled_type()
    wrappers, reference, current = [], None, module
    while True:
        if compiled is not None and isinstance(current, compiled):
            inner = current._orig_mod
        elif isinstance(current, parallel):
            inner = current.module
        elif _is_peft(current):
            _check_peft(current)
            reference = current if reference is None else reference
            inner = current.get_base_model()  # PEFT's method (found by _is_peft), not nn.Module's
        else:
            break
        if not isinstance(inner, nn.Module) or inner is current:
            break
        wrappers.append(type(current).__name__)
        current = inner
    return Unwrapped(current, current if reference is None else reference, tuple(wrappers))


@contextlib.contextmanager
def unchecked_layers(model: nn.Module) -> Iterator[None]:
    """Inside the block no layer of ``model`` checkpoints its activations; on exit each gets its flag back.

    Costs the activation memory of the passes run inside (explanation passes of one batch), not of training.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> net = BertForSequenceClassification(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
        ...                                                num_attention_heads=2, intermediate_size=8))
        >>> net.gradient_checkpointing_enable()
        >>> with unchecked_layers(net):
        ...     net.bert.encoder.layer[0].gradient_checkpointing
        False
        >>> net.bert.encoder.layer[0].gradient_checkpointing
        True
    """
    flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    try:
        for module in flagged:  # setattr: torch types Module.__setattr__'s value as Tensor | Module
            module.gradient_checkpointing = False
        yield
    finally:
        for module in flagged:
            module.gradient_checkpointing = True
