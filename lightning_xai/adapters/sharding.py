"""Explain a model sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``, Lightning's ``ModelParallelStrategy``).

``fully_shard(module)`` shards the parameters ``module`` holds (all of its subtree except what a nested
``fully_shard``-ed module holds) into DTensors, one shard per process, and gathers them in ``module``'s forward
pre-hook: an FSDP module *called* has its parameters; any other submodule called *directly*, outside the forward of
the FSDP module that owns its parameters, sees sharded DTensors ("aten.embedding.default got mixed torch.Tensor and
DTensor"). The adapters make such a direct call for the word embedding (``embed``); the other passes go through the
model's own forward (a decoder classifier's under sharding too: :func:`~lightning_xai.adapters.huggingface.pooling.
pooled_logits`), since an FSDP layer called outside the root's forward refuses to run ("FSDP requires running
forward through the root module first").

:func:`gathered` is the one place that handles it: inside the block the owner of every module passed to it (its
nearest FSDP module, within the explained model) is unsharded with FSDP's own ``FSDPModule.unshard()`` -- only that
group, as FSDP's own pre-forward would; never the whole model -- and resharded on exit if it was sharded on entry.
A module that is an FSDP module itself is left to its own hooks.

Gradients w.r.t. the parameters (a training loss computed through the adapter, e.g.
:class:`~lightning_xai.losses.DeceptionPenalty`) need one more step, :func:`routed_through_root`: FSDP reduce-scatters
a group's gradients when the gradient of its forward's *inputs* is complete; passed ``inputs_embeds`` that require
grad, the root did so before the word embedding (run by ``embed``, upstream) had added its gradient, which was then
lost to this step and leaked into the next. With gradients on, the root is run from ``input_ids`` and the word
embedding's output replaced by the given embeddings (a forward hook), so its reduce-scatter comes after every
gradient of the pass.

Every unshard is a collective (an all-gather over the processes): a pass that runs on some processes and not on
others waits forever. The audits therefore run the same passes on every process of a sharded model (see
``lightning_xai.callbacks.base.AuditCallback``); :func:`is_sharded` tells them when. Same examples, same gathered
parameters and same seeded generators give every process the same sequence of passes -- but where the number of
passes depends on computed values (an erasure that stops at the first flipped decision, an integrated-gradients
rule that refines until it converges, a replay that checks its packed layout against the plain one, rows with
non-finite logits set aside), two processes would part ways on a last-bit difference of their kernels. Inside
:func:`lockstep` (the audits enter it on a sharded model) each such decision goes through :func:`agree` /
:func:`agree_flag`: process 0's value, broadcast to every process at the same point, so every process takes the same
branch by construction. Outside it they return their argument.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Dict, Iterable, Iterator, List, Optional, cast

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import ProtocolError

__all__ = [
    "agree",
    "agree_flag",
    "fsdp_modules",
    "gathered",
    "is_sharded",
    "lockstep",
    "routed_through_root",
    "sharding_restored",
    "sharding_settled",
]


_LOCKSTEP: ContextVar[bool] = ContextVar("lightning_xai_lockstep", default=False)


@contextlib.contextmanager
def lockstep(active: bool = True) -> Iterator[None]:
    """Inside the block (when ``active``), :func:`agree` and :func:`agree_flag` share process 0's decisions.

    Example:
        >>> with lockstep():
        ...     agree_flag(True)   # one process: its own value
        True
    """
    token = _LOCKSTEP.set(bool(active))
    try:
        yield
    finally:
        _LOCKSTEP.reset(token)


def _sharing() -> bool:
    return (
        _LOCKSTEP.get()
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def agree(value: Tensor) -> Tensor:
    """Inside :func:`lockstep` on several processes, process 0's ``value`` (same shape and dtype on every process;
    one broadcast, which every process must reach at the same point); elsewhere ``value`` itself.

    Example:
        >>> agree(torch.tensor([1, 2])).tolist()
        [1, 2]
    """
    if not _sharing():
        return value
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.distributed.get_backend() == "nccl"
        else torch.device("cpu")
    )
    shared = (
        value.detach()
        .to(device=device, dtype=torch.uint8 if value.dtype == torch.bool else value.dtype, copy=True)
        .contiguous()
    )
    torch.distributed.broadcast(shared, src=0)
    return shared.to(device=value.device, dtype=value.dtype)


def agree_flag(flag: bool) -> bool:
    """:func:`agree` of one boolean.

    Example:
        >>> agree_flag(False)
        False
    """
    return bool(agree(torch.tensor([bool(flag)]))[0]) if _sharing() else bool(flag)


def _fsdp_type() -> Optional[type]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch built without distributed, or older than FSDP2
        return None
    return FSDPModule


def _dtensor_type() -> Optional[type]:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    return DTensor


def fsdp_modules(model: nn.Module) -> List[nn.Module]:
    """The modules of ``model`` (itself included) that ``fully_shard`` was applied to, outermost first.

    Example:
        >>> fsdp_modules(nn.Linear(2, 2))
        []
    """
    kind = _fsdp_type()
    return [] if kind is None else [m for m in model.modules() if isinstance(m, kind)]


#: inside :func:`sharding_settled`: id(model) -> (model, whether it is sharded); ``None`` outside
_SETTLED: ContextVar[Optional[Dict[int, Any]]] = ContextVar("lightning_xai_sharding_settled", default=None)


@contextlib.contextmanager
def sharding_settled() -> Iterator[None]:
    """Inside the block :func:`is_sharded` walks each model once: a model's sharding does not change while it is
    explained, and an audit asks before every pass (a walk over every module and parameter: about 5 % of an
    ``ErasureAudit`` of a LoRA Llama, benchmarks/README.md). A nested block shares the outer one's answers.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> with sharding_settled():
        ...     is_sharded(net), is_sharded(net)
        (False, False)
    """
    if _SETTLED.get() is not None:
        yield
        return
    token = _SETTLED.set({})
    try:
        yield
    finally:
        _SETTLED.reset(token)


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is sharded by FSDP2 (an FSDP module inside it, or a DTensor parameter);
    inside :func:`sharding_settled`, the first answer for ``model``.

    Example:
        >>> is_sharded(nn.Linear(2, 2))
        False
    """
    settled = _SETTLED.get()
    if settled is not None and id(model) in settled and settled[id(model)][0] is model:
        return bool(settled[id(model)][1])
    dtensor = _dtensor_type()
    answer = bool(fsdp_modules(model)) or (
        dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())
    )
    if settled is not None:
        settled[id(model)] = (model, answer)  # the model itself kept: its id cannot be reused while it is here
    return answer


def _owner(model: nn.Module, module: nn.Module) -> Optional[nn.Module]:
    """The nearest FSDP module holding ``module`` (itself included), searched within ``model``; ``None``: none."""
    kind = _fsdp_type()
    path = next((name for name, m in model.named_modules() if m is module), None)
    if kind is None or path is None:
        return None
    parts = path.split(".") if path else []
    for depth in range(len(parts), -1, -1):
        candidate = model.get_submodule(".".join(parts[:depth]))
        if isinstance(candidate, kind):
            return candidate
    return None


def _group_parameters(owner: nn.Module) -> Iterator[nn.Parameter]:
    """The parameters ``owner``'s own FSDP group holds: its subtree's, less those of nested FSDP modules."""
    kind = _fsdp_type()
    stack = [owner]
    while stack:
        module = stack.pop()
        yield from module.parameters(recurse=False)
        stack.extend(c for c in module.children() if kind is None or not isinstance(c, kind))


def _sharded_now(owner: nn.Module) -> bool:
    dtensor = _dtensor_type()
    return dtensor is not None and any(isinstance(p, dtensor) for p in _group_parameters(owner))


@contextlib.contextmanager
def gathered(model: nn.Module, called: Iterable[nn.Module]) -> Iterator[None]:
    """Inside the block the modules ``called`` (submodules of ``model``, called outside an FSDP forward) have their
    parameters: the owner of each (its nearest FSDP module) is unsharded, and resharded on exit when it was sharded
    on entry. A no-op for a model that is not sharded.

    Every process must enter the block at the same point of the same sequence of passes (``unshard`` is an
    all-gather).

    Raises:
        ProtocolError: a module's parameters are sharded by an FSDP module outside ``model`` (``fully_shard``
            applied to the LightningModule rather than to the explained model), which the adapter cannot unshard.

    Example:
        >>> net = nn.Sequential(nn.Embedding(5, 2), nn.Linear(2, 2))
        >>> with gathered(net, [net[0]]):
        ...     net[0].weight.shape
        torch.Size([5, 2])
    """
    called = list(called)
    if not is_sharded(model):
        yield
        return
    dtensor = _dtensor_type()
    owners: List[nn.Module] = []
    for module in called:
        owner = _owner(model, module)
        if owner is None:
            if dtensor is not None and any(isinstance(p, dtensor) for p in module.parameters()):
                raise ProtocolError(
                    f"the parameters of {type(module).__name__} are sharded by an FSDP module outside the explained "
                    f"model {type(model).__name__}, which the explanation cannot gather. Apply fully_shard to the "
                    "explained model (and its layers) in configure_model, not to a module that holds it."
                )
            continue
        if owner is not module and owner not in owners and _sharded_now(owner):
            owners.append(owner)
    for owner in owners:
        cast(Any, owner).unshard()  # FSDPModule's method (the class is checked by _owner)
    try:
        yield
    finally:
        for owner in reversed(owners):
            cast(Any, owner).reshard()


@contextlib.contextmanager
def sharding_restored(model: Any) -> Iterator[None]:
    """On exit, every FSDP module of ``model`` whose parameters were sharded on entry is resharded (FSDP's own
    ``FSDPModule.reshard()``: local, no collective), so the model holds the parameter objects it held on entry.

    FSDP does not reshard the root group after its forward (its backward would gather it again), and the parameters
    a group registers on the model while unsharded are other objects than the sharded ones the optimizer holds,
    which copy ``requires_grad`` from them when gathered. A forward inside an explanation that froze the sharded
    parameters (``explanation_context(freeze_parameters=True)``) would otherwise leave the root unsharded with frozen
    gathered parameters registered: the next training step would compute no gradient for the root's parameters
    (embeddings, head). A no-op for a model that is not sharded.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> with sharding_restored(net):
        ...     net.weight.shape
        torch.Size([2, 2])
    """
    if not isinstance(model, nn.Module) or not is_sharded(model):
        yield
        return
    sharded = [m for m in fsdp_modules(model) if _sharded_now(m)]
    try:
        yield
    finally:
        for module in reversed(sharded):  # innermost first, as FSDP reshards after a forward
            if not _sharded_now(module):
                cast(Any, module).reshard()


@contextlib.contextmanager
def routed_through_root(
    model: nn.Module, embedding: nn.Module, kwargs: Dict[str, Any], input_ids: Optional[Tensor]
) -> Iterator[None]:
    """Inside the block, ``model(**kwargs)`` of a sharded model with gradients on reads ``input_ids`` and the
    ``embedding`` module returns ``kwargs["inputs_embeds"]`` (module docstring); ``kwargs`` is changed in place,
    and the hook removed on exit. Otherwise (not sharded, no gradient, or ids of another shape) nothing changes.

    Raises:
        ProtocolError: the model calls the embedding twice in the pass (a shared encoder-decoder embedding).

    Example:
        >>> kwargs = {"inputs_embeds": torch.zeros(1, 2, 3)}
        >>> with routed_through_root(nn.Linear(2, 2), nn.Embedding(4, 3), kwargs, torch.tensor([[1, 2]])):
        ...     sorted(kwargs)
        ['inputs_embeds']
    """
    embeddings = kwargs.get("inputs_embeds")
    if not (
        isinstance(embeddings, Tensor)
        and embeddings.requires_grad
        and torch.is_grad_enabled()
        and isinstance(input_ids, Tensor)
        and input_ids.shape == embeddings.shape[:2]
        and is_sharded(model)
    ):
        yield
        return
    del kwargs["inputs_embeds"]
    kwargs["input_ids"] = input_ids
    calls = [0]

    def replace(module: nn.Module, args: Any, output: Any) -> Tensor:
        calls[0] += 1
        if calls[0] > 1:  # an embedding shared by two inputs (an encoder-decoder's): which one to replace is unknown
            raise ProtocolError(
                f"{type(model).__name__} calls its word embedding more than once in a forward pass, so a sharded "
                "pass with gradients cannot replace its output by the given embeddings. Explain it unsharded, or "
                "without gradients w.r.t. its parameters."
            )
        return embeddings

    handle = embedding.register_forward_hook(replace)
    try:
        yield
    finally:
        handle.remove()
