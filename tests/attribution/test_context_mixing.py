"""Context-mixing methods against hand computations built from the model's own modules and hooks (float64)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")

from lightning_xai.adapters import HuggingFaceAdapter  # noqa: E402
from lightning_xai.adapters.protocol import ProtocolError  # noqa: E402
from lightning_xai.attribution import attribute  # noqa: E402
from lightning_xai.attribution.context_mixing import (
    alti,
    attention_flow,
    attention_norm,
    grad_attention,  # noqa: E402
    max_flow_value,
    value_zeroing,
)
from lightning_xai.attribution.context_mixing.flow import flow_capacities  # noqa: E402


def make_bert(seed=0, layers=2, heads=4, hidden=32):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=60,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=32,
        attn_implementation="eager",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.3,
    )
    return HuggingFaceAdapter(transformers.BertForSequenceClassification(config).double().eval())


def make_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        pad_token_id=0,
        attn_implementation="eager",
        initializer_range=0.3,
    )
    return HuggingFaceAdapter(transformers.LlamaForSequenceClassification(config).double().eval(), query_index=-1)


def bert_batch():
    ids = torch.tensor([[2, 11, 25, 37, 48, 3], [2, 17, 9, 3, 0, 0]])
    attention_mask = (ids != 0).long()
    return {
        "input_ids": ids,
        "attention_mask": attention_mask,
        "token_type_ids": torch.zeros_like(ids),
        "mask": attention_mask.bool() & (ids != 2) & (ids != 3),
    }


def llama_batch():
    # no padding: left-padded rows come out of this transformers version's eager Llama as NaN (the pad query rows
    # are fully masked), so the pooled last position is tested on full rows
    ids = torch.tensor([[5, 11, 25, 37, 48], [7, 33, 17, 9, 21]])
    attention_mask = (ids != 0).long()
    return {"input_ids": ids, "attention_mask": attention_mask, "mask": attention_mask.bool()}


FAMILIES = {"bert": (make_bert, bert_batch), "llama": (make_llama, llama_batch)}


def blocks(adapter):
    inner = adapter.model
    return list(inner.bert.encoder.layer) if hasattr(inner, "bert") else list(inner.model.layers)


def value_module(block):
    return block.attention.self.value if hasattr(block, "attention") else block.self_attn.v_proj


def capture(adapter, batch, modules, inputs=False):
    """Run the adapter once; return its output and each module's input (``inputs``) or output."""
    seen = {}

    def record(module, args, output, i):
        seen.setdefault(i, args[0] if inputs else (output[0] if isinstance(output, tuple) else output))

    handles = [m.register_forward_hook(lambda mod, a, o, i=i: record(mod, a, o, i)) for i, m in enumerate(modules)]
    try:
        out = adapter(batch)
    finally:
        for h in handles:
            h.remove()
    return out, [seen[i] for i in range(len(modules))]


def head_vector(block, x_j, h, n_heads):
    """``f^h(x_j)`` by hand from the block's own weights (the value input normed first for pre-norm blocks)."""
    if hasattr(block, "attention"):
        w_v, b_v, w_o = (
            block.attention.self.value.weight,
            block.attention.self.value.bias,
            block.attention.output.dense.weight,
        )
        n_kv = n_heads
    else:
        x_j = block.input_layernorm(x_j)
        w_v, b_v, w_o = block.self_attn.v_proj.weight, block.self_attn.v_proj.bias, block.self_attn.o_proj.weight
        n_kv = w_v.shape[0] // (w_o.shape[1] // n_heads)
    dh = w_o.shape[1] // n_heads
    kv = h // (n_heads // n_kv)
    rows = slice(kv * dh, (kv + 1) * dh)
    value = w_v[rows] @ x_j + (b_v[rows] if b_v is not None else 0.0)
    return w_o[:, h * dh : (h + 1) * dh] @ value


def pooled(adapter, batch):
    T = batch["input_ids"].shape[1]
    return [adapter.query_index % T] * batch["input_ids"].shape[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("layer", [0, -1])
def test_attention_norm_matches_hand_loop(family, layer):
    make, make_batch = FAMILIES[family]
    adapter, batch = make(), make_batch()
    layers = blocks(adapter)
    out, inputs = capture(adapter, batch, layers, inputs=True)
    block, x, A = layers[layer], inputs[layer], out.raw_attentions[layer]
    H = A.shape[1]
    expected = torch.zeros(A.shape[0], A.shape[-1], dtype=torch.float64)
    for b, q in enumerate(pooled(adapter, batch)):
        for j in range(A.shape[-1]):
            total = sum(A[b, h, q, j] * head_vector(block, x[b, j], h, H) for h in range(H))
            expected[b, j] = total.norm()
    with torch.no_grad():
        got = attention_norm(adapter, batch, layer=layer)
    present = batch["attention_mask"].bool()
    assert torch.allclose(got[present], expected[present], rtol=1e-5, atol=1e-10)
    assert expected[present].min() > 0
    mapped = attribute(adapter, batch, "attention_norm", layer=layer)
    assert torch.equal(mapped, got.masked_fill(~batch["mask"], 0.0))


def value_zeroing_oracle(adapter, batch):
    """Per-token loop: re-run the whole model with one position's value vectors zeroed in one layer (a hook)."""
    layers = blocks(adapter)
    present = batch["attention_mask"].bool()
    B, T = present.shape
    with torch.no_grad():
        _, reference = capture(adapter, batch, layers)
        matrices = []
        for index, block in enumerate(layers):
            C = torch.zeros(B, T, T, dtype=torch.float64)
            for j in range(T):

                def zero(module, args, output, j=j):
                    output = output.clone()
                    output[:, j] = 0.0
                    return output

                handle = value_module(block).register_forward_hook(zero)
                try:
                    _, changed = capture(adapter, batch, [block])
                finally:
                    handle.remove()
                C[:, :, j] = 1 - torch.cosine_similarity(changed[0], reference[index], dim=-1)
            C = C * (present.unsqueeze(1) & present.unsqueeze(2))
            matrices.append(C / C.sum(-1, keepdim=True).clamp_min(1e-300))
    return matrices


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_value_zeroing_matches_per_token_loop(family):
    make, make_batch = FAMILIES[family]
    adapter, batch = make(), make_batch()
    matrices = value_zeroing_oracle(adapter, batch)
    present = batch["attention_mask"].bool()
    rows = torch.arange(len(present)), torch.tensor(pooled(adapter, batch))
    with torch.no_grad():
        for layer, C in enumerate(matrices):
            got = value_zeroing(adapter, batch, layer=layer)
            assert torch.allclose(got[present], C[rows][present], atol=1e-5)
        rolled = matrices[1] @ matrices[0]
        got = value_zeroing(adapter, batch)
        assert torch.allclose(got[present], rolled[rows][present], atol=1e-5)
        chunked = value_zeroing(adapter, batch, internal_batch_size=5)
        assert torch.allclose(chunked, got, atol=1e-12)
    assert torch.allclose(got.sum(-1), torch.ones(2, dtype=torch.float64))
    if family == "llama":  # causal: a token's values never reach an earlier position
        assert torch.triu(matrices[0][0], diagonal=1).abs().max() < 1e-12


def alti_oracle(adapter, batch):
    """ALTI by hand: per query i and token j, loops over heads; LN/residual from the formulas, not the modules."""
    layers = blocks(adapter)
    out, inputs = capture(adapter, batch, layers, inputs=True)
    present = batch["attention_mask"].bool()
    B, T = present.shape
    matrices = []
    for index, block in enumerate(layers):
        x, A = inputs[index], out.raw_attentions[index]
        H = A.shape[1]
        post_ln = hasattr(block, "attention")
        out_proj = block.attention.output.dense if post_ln else block.self_attn.o_proj
        bias = out_proj.bias if out_proj.bias is not None else torch.zeros(x.shape[-1], dtype=x.dtype)
        C = torch.zeros(B, T, T, dtype=torch.float64)
        for b in range(B):
            keys = present[b].nonzero().flatten().tolist()
            for i in keys:
                z = {j: sum(A[b, h, i, j] * head_vector(block, x[b, j], h, H) for h in range(H)) for j in keys}
                z[i] = z[i] + x[b, i]
                s = sum(z.values()) + bias
                if post_ln:
                    ln = block.attention.output.LayerNorm
                    sigma = torch.sqrt(((s - s.mean()) ** 2).mean() + ln.eps)
                    y = ln.weight * (s - s.mean()) / sigma + ln.bias
                    parts = {j: ln.weight * (v - v.mean()) / sigma for j, v in z.items()}
                else:
                    y, parts = s, z
                for j in keys:
                    C[b, i, j] = max(0.0, float(y.abs().sum() - (y - parts[j]).abs().sum()))
                C[b, i] /= C[b, i].sum()
        matrices.append(C)
    return matrices


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_alti_matches_hand_computation(family):
    make, make_batch = FAMILIES[family]
    adapter, batch = make(), make_batch()
    with torch.no_grad():
        C1, C2 = alti_oracle(adapter, batch)
        present = batch["attention_mask"].bool()
        rows = torch.arange(len(present)), torch.tensor(pooled(adapter, batch))
        assert torch.allclose(alti(adapter, batch, layer=0)[present], C1[rows][present], atol=1e-10)
        got = alti(adapter, batch)
        assert torch.allclose(got[present], (C2 @ C1)[rows][present], atol=1e-10)
    assert (got[present] > 0).sum() >= 3


def test_max_flow_matches_networkx():
    nx = pytest.importorskip("networkx")
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = 8
        cap = torch.rand(n, n, generator=gen).double() * (torch.rand(n, n, generator=gen) < 0.4)
        cap.fill_diagonal_(0.0)
        graph = nx.DiGraph()
        graph.add_nodes_from(range(n))
        for u, v in cap.nonzero().tolist():
            graph.add_edge(u, v, capacity=float(cap[u, v]))
        assert max_flow_value(cap.numpy(), 0, n - 1) == pytest.approx(nx.maximum_flow_value(graph, 0, n - 1), abs=1e-12)


@pytest.mark.parametrize("solver, atol", [("edmonds_karp", 1e-9), ("dinic", 1e-7)])
def test_attention_flow_matches_networkx_on_the_layer_graph(solver, atol):
    nx = pytest.importorskip("networkx")
    adapter, batch = make_bert(layers=3), bert_batch()
    with torch.no_grad():
        out = adapter(batch)
        got = attention_flow(adapter, batch, normalize_flows=False, solver=solver)
    caps = flow_capacities(out.raw_attentions)
    present = batch["attention_mask"].bool()
    for b in range(2):
        keys = present[b].nonzero().flatten().tolist()
        graph = nx.DiGraph()
        for layer in range(caps.shape[0]):
            for i in keys:
                for j in keys:
                    graph.add_edge((layer, j), (layer + 1, i), capacity=float(caps[layer, b, i, j]))
        expected = [nx.maximum_flow_value(graph, (0, j), (caps.shape[0], 0)) for j in keys]
        expected = torch.tensor(expected, dtype=torch.float64)
        assert torch.allclose(got[b, keys], expected, atol=atol)
        assert (got[b, keys] <= expected + 1e-12).all()  # the floored capacities never raise a flow
    normalised = attention_flow(adapter, batch, solver=solver)
    assert torch.allclose(normalised.sum(-1), torch.ones(2, dtype=torch.float64))


def test_attention_flow_solvers_agree_on_a_longer_input_and_bad_solvers_are_named(monkeypatch):
    pytest.importorskip("scipy")
    gen = torch.Generator().manual_seed(1)
    adapter = make_bert(layers=3)
    ids = torch.randint(5, 30, (1, 14), generator=gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    exact = attention_flow(adapter, batch, solver="edmonds_karp", normalize_flows=False)
    fast = attention_flow(adapter, batch, solver="dinic", normalize_flows=False)
    assert torch.allclose(fast, exact, atol=1e-7) and not torch.equal(fast, torch.zeros_like(fast))
    with pytest.raises(ValueError, match="solver must be one of"):
        attention_flow(adapter, batch, solver="push_relabel")
    monkeypatch.setitem(sys.modules, "scipy.sparse.csgraph", None)  # SciPy missing
    with pytest.raises(ImportError, match="pip install scipy"):
        attention_flow(adapter, batch, solver="dinic")
    assert torch.equal(attention_flow(adapter, batch, normalize_flows=False), exact)  # auto falls back


def test_grad_attention_matches_hand_rollout_and_finite_differences():
    adapter, batch = make_bert(), bert_batch()
    embeddings = adapter.embed(batch).detach().requires_grad_(True)
    out = adapter.forward_from_embeddings(embeddings, batch)
    target = out.logits.argmax(-1)
    score = out.logits.gather(1, target[:, None]).sum()
    grads = torch.autograd.grad(score, out.raw_attentions)
    T = embeddings.shape[1]
    expected = []
    for b in range(2):
        R = torch.eye(T, dtype=torch.float64)
        for A, G in zip(out.raw_attentions, grads):
            cam = sum((G[b, h] * A[b, h]).clamp(min=0) for h in range(A.shape[1])) / A.shape[1]
            R = R + cam @ R
        expected.append(R[0])
    got = grad_attention(adapter, batch)
    assert torch.allclose(got, torch.stack(expected), atol=1e-12)
    # the gradient is the one of the attention the model multiplies: central differences on the last [CLS] rows
    rows = out.extras["cls_rows"].detach()
    eps, h, j = 1e-6, 1, 2
    bumped = [rows.clone() for _ in range(2)]
    bumped[0][:, h, j] += eps
    bumped[1][:, h, j] -= eps
    with torch.no_grad():
        plus, minus = (adapter(batch, attention_override=r).logits.gather(1, target[:, None]) for r in bumped)
    assert torch.allclose((plus - minus).squeeze(1) / (2 * eps), grads[-1][:, h, 0, j], rtol=1e-5, atol=1e-8)


def test_errors_name_the_problem():
    adapter, batch = make_bert(), bert_batch()
    with pytest.raises(ValueError, match="layer=5 does not exist"):
        attribute(adapter, batch, "attention_norm", layer=5)
    from lightning_xai.models import AttentionClassifier

    model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
    small = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
    with pytest.raises(ProtocolError, match="HuggingFaceAdapter"):
        attribute(model, small, "value_zeroing")


def test_mean_pooling_heads_get_the_mean_of_their_rows():
    """ModernBERT ``classifier_pooling="mean"``: grad_attention and attention_flow average the pooled rows
    (each row's result is the one the adapter gives when told to read that row); it was a TypeError."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    torch.manual_seed(0)
    config = ModernBertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        classifier_pooling="mean",
        global_attn_every_n_layers=2,
        local_attention=4,
        pad_token_id=1,
        attn_implementation="eager",
    )
    model = ModernBertForSequenceClassification(config).double().eval()
    ids = torch.tensor([[2, 7, 8, 9, 3], [2, 10, 3, 1, 1]])
    attention_mask = (ids != 1).long()
    batch = {"input_ids": ids, "attention_mask": attention_mask, "mask": (ids > 3)}
    adapter = HuggingFaceAdapter(model)
    assert adapter.query_index is None
    for method in ("grad_attention", "attention_flow"):
        got = attribute(adapter, batch, method).detach()
        for b, length in enumerate(attention_mask.sum(1).tolist()):
            rows = []
            for q in range(length):
                single = HuggingFaceAdapter(model, query_index=q)
                rows.append(
                    attribute(
                        single,
                        {k: v[b : b + 1] for k, v in batch.items()},
                        method,
                        got.new_tensor([int(adapter(batch).logits[b].argmax())]).long(),
                    ).detach()[0]
                )
            assert torch.allclose(got[b], torch.stack(rows).mean(0), atol=1e-8), method
