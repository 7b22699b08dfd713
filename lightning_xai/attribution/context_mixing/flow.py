"""``"attention_flow"``: maximum flow through the layered attention graph (Abnar & Zuidema, 2020).

"Quantifying Attention Flow in Transformers" (ACL 2020). Nodes are (layer, position) pairs, layer 0 being the input
embeddings. Layer ``l``'s attention, averaged over heads with the residual added as an identity and rows renormalised,
``Â_l = rownorm(mean_h A_l + I)`` (the matrices of ``"rollout"``), gives edge ``(l−1, j) → (l, i)`` the capacity
``Â_l[i, j]``. Token ``j``'s flow is the maximum-flow value from ``(0, j)`` to the summary node ``(L, q)``; as in the
authors' code the flows of a row are divided by their sum over the non-pad positions.

One maximum flow per non-pad token, on the non-pad positions, by one of two solvers (``solver=``):

* ``"dinic"`` (the default when SciPy is installed): :func:`scipy.sparse.csgraph.maximum_flow`'s Dinic algorithm in
  compiled code. It needs integer capacities, so each capacity is floored to a multiple of ``2**-30``
  (:data:`FLOW_SCALE`); a flow is then low by at most (number of edges in a minimum cut) · 2⁻³⁰ — in practice
  ~1e-8 — and never high. ~130× the Edmonds–Karp loop at 64 tokens; ~4 s per 256-token review for MiniLM's 6 layers.
* ``"edmonds_karp"`` (the fallback without SciPy): :func:`max_flow_value`, shortest augmenting paths in NumPy on float
  capacities, exact to rounding; its cost grows like ``T · (L·T)²`` per augmenting path: for sentences, not documents.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch
from lightning_xai.attribution.context_mixing._hf_internals import pad_mask, query_weights
from lightning_xai.attribution.core import resolve_target
from lightning_xai.attribution.registry import register_method

__all__ = ["FLOW_SCALE", "SOLVERS", "attention_flow", "flow_capacities", "max_flow_value"]

#: Capacities are floored to integer multiples of ``1 / FLOW_SCALE`` for the Dinic solver (int32 capacities: a
#: capacity is at most 1, and the flow into the summary node is at most 1).
FLOW_SCALE = 2**30
SOLVERS = ("auto", "dinic", "edmonds_karp")


def max_flow_value(capacity: np.ndarray, source: int, sink: int, tol: float = 1e-12) -> float:
    """Maximum flow from ``source`` to ``sink`` of a graph given as a dense ``[N, N]`` capacity matrix.

    Edmonds–Karp: breadth-first (shortest) augmenting paths in the residual graph until none has capacity > ``tol``.

    Example (RoBERTa):
        >>> import torch
        >>> import transformers
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> from lightning_xai.attribution import attribute
        >>> gen = torch.manual_seed(0)
        >>> roberta = transformers.RobertaForSequenceClassification(transformers.RobertaConfig(
        ...     vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
        ...     max_position_embeddings=20, attn_implementation="eager")).eval()
        >>> ids = torch.tensor([[0, 7, 8, 2]])
        >>> batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), mask=torch.tensor([[0, 1, 1, 0]]).bool())
        >>> flows = attribute(HuggingFaceAdapter(roberta), batch, "attention_flow")
        >>> flows.shape, bool((flows[0, 1:3] > 0).all()), bool(flows.sum() < 1)
        (torch.Size([1, 4]), True, True)
    """
    residual = np.array(capacity, dtype=np.float64)
    if residual.ndim != 2 or residual.shape[0] != residual.shape[1]:
        raise ValueError(f"capacity must be a square [N, N] matrix; got shape {residual.shape}.")
    if (residual < 0).any():
        raise ValueError("capacities must be non-negative.")
    total = 0.0
    n = residual.shape[0]
    while True:
        parent = np.full(n, -1)
        parent[source] = source
        frontier = np.array([source])
        while frontier.size and parent[sink] < 0:
            reach = residual[frontier] > tol
            new = reach.any(axis=0) & (parent < 0)
            found = np.flatnonzero(new)
            if not found.size:
                break
            parent[found] = frontier[reach[:, found].argmax(axis=0)]
            frontier = found
        if parent[sink] < 0:
            return total
        path = [sink]
        while path[-1] != source:
            path.append(int(parent[path[-1]]))
        heads, tails = np.array(path[1:]), np.array(path[:-1])
        bottleneck = residual[heads, tails].min()
        residual[heads, tails] -= bottleneck
        residual[tails, heads] += bottleneck
        total += float(bottleneck)


def flow_capacities(raw_attentions: Sequence[Tensor]) -> Tensor:
    """``[L, B, T, T]`` edge capacities ``Â_l = rownorm(mean_h A_l + I)`` (query ``i``, key ``j``)."""
    mats = []
    for layer in raw_attentions:
        mixed = layer.mean(dim=1)
        mixed = mixed + torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        mats.append(mixed / mixed.sum(-1, keepdim=True))
    return torch.stack(mats)


def _resolve_solver(solver: str) -> str:
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}; got {solver!r}.")
    try:
        import scipy.sparse.csgraph  # noqa: F401
    except ImportError:
        if solver == "dinic":
            raise ImportError(
                "attention_flow(solver='dinic') needs SciPy: pip install scipy, or pass "
                "solver='edmonds_karp' (exact, in NumPy, much slower on long inputs)."
            ) from None
        return "edmonds_karp"
    return "dinic" if solver == "auto" else solver


def _row_flows(caps: np.ndarray, query: int, solver: str) -> np.ndarray:
    """Flows from every input position to node ``(L, query)`` of one example; ``caps`` ``[L, n, n]``."""
    L, n, _ = caps.shape
    graph = np.zeros(((L + 1) * n, (L + 1) * n))
    for layer in range(L):  # edge (layer, j) -> (layer + 1, i) with capacity caps[layer][i, j]
        graph[layer * n : (layer + 1) * n, (layer + 1) * n : (layer + 2) * n] = caps[layer].T
    sink = L * n + query
    if solver == "edmonds_karp":
        return np.array([max_flow_value(graph, j, sink) for j in range(n)])
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    integer = csr_matrix(np.floor(graph * FLOW_SCALE).astype(np.int32))
    return np.array([maximum_flow(integer, j, sink, method="dinic").flow_value for j in range(n)]) / FLOW_SCALE


@register_method("attention_flow", resolves_target=True)
def attention_flow(
    model: Any,
    batch: Batch,
    target: Any = None,
    *,
    create_graph: bool = False,
    normalize_flows: bool = True,
    solver: str = "auto",
) -> Tensor:
    """``[B, T]`` attention flow from each position to the classifier's summary node (Abnar & Zuidema 2020).

    Needs only the raw attention maps: every family the adapter runs with eager attention. Not differentiable
    (``create_graph`` is accepted and ignored: the flow is computed in NumPy).

    Args:
        model: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        batch: its batch.
        target: only validated.
        create_graph: ignored (see above).
        normalize_flows: divide each row's flows by their sum over non-pad positions (default, as the authors do).
        solver: ``"dinic"`` (SciPy, capacities floored to multiples of 2⁻³⁰), ``"edmonds_karp"`` (NumPy, exact) or
            ``"auto"`` (Dinic when SciPy is installed); see the module docstring.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> from lightning_xai.attribution import attribute
        >>> _ = torch.manual_seed(0)
        >>> config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        ...                     intermediate_size=16, max_position_embeddings=16, attn_implementation="eager")
        >>> adapter = HuggingFaceAdapter(BertForSequenceClassification(config).eval())
        >>> batch = {"input_ids": torch.tensor([[2, 7, 8, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
        ...          "mask": torch.tensor([[False, True, True, False]])}
        >>> scores = attribute(adapter, batch, "attention_flow")
        >>> scores.shape, bool((scores > 0).all(dim=0)[1:3].all())
        (torch.Size([1, 4]), True)
    """
    solver = _resolve_solver(solver)
    with torch.no_grad():
        out = model.forward_from_embeddings(model.embed(batch), batch)
        resolve_target(out.logits, target)
        if not out.raw_attentions:
            raise ValueError(f"{type(model).__name__} returned no raw attention maps; attention_flow needs them.")
        caps = flow_capacities(out.raw_attentions).double().cpu().numpy()
        present = pad_mask(batch, out.raw_attentions[0][:, 0]).cpu()
        B, T = present.shape
        weights = query_weights(model, out, B, T, "cpu").double().numpy()
        flows = np.zeros((B, T))
        for b in range(B):
            keep = np.flatnonzero(present[b].numpy())
            for position in np.flatnonzero(weights[b]):  # one pooled row, or each row of a mean-pooling head
                query = int(np.searchsorted(keep, position))
                if query >= keep.size or keep[query] != position:
                    raise ValueError(f"row {b}'s summary position {int(position)} is a pad position.")
                row = _row_flows(caps[:, b][:, keep][:, :, keep], query, solver)
                row = row / max(row.sum(), np.finfo(float).tiny) if normalize_flows else row
                flows[b, keep] += weights[b, position] * row
    return torch.as_tensor(flows, dtype=out.logits.dtype, device=out.logits.device)
