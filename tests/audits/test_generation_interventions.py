"""The generation interventions below the callbacks (lightning_xai.audits.generation, .generation_erasure) on a tiny
random Llama: the attention-row gradient equals autograd through a hand-patched eager attention whose last-layer
step rows are a leaf tensor; an identity permutation (one source token) changes nothing; permutations are drawn per
row, independently of the batch; a row whose source is one token has nothing to erase (0, no flip)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.audits.generation import generation_attention_baselines, permute_step_rows
from lightning_xai.audits.generation_erasure import attention_row_gradient, generation_erasure


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    net = LlamaForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # a sharp, heavily read last attention: the interventions change the target clearly
        net.model.layers[-1].self_attn.q_proj.weight.mul_(30.0)
        net.model.layers[-1].self_attn.o_proj.weight.mul_(10.0)
    return net


def batch_of(rows):
    """Right-padded causal rows ``(prompt, target)``: labels -100 on the prompt and pads."""
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for i, (prompt, target) in enumerate(rows):
        ids[i, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        labels[i, len(prompt) : len(prompt) + len(target)] = torch.tensor(target)
    return {
        "input_ids": ids,
        "attention_mask": (
            torch.arange(width)[None] < torch.tensor([len(p) + len(t) for p, t in rows])[:, None]
        ).long(),
        "labels": labels,
    }


def test_attention_row_gradient_equals_autograd_through_a_patched_eager_attention(llama, monkeypatch):
    prompt, target = [5, 6, 7, 8, 9], [10, 11, 12]
    batch = batch_of([(prompt, target)])
    gradient, grad_x_attention = attention_row_gradient(HuggingFaceAdapter(llama), batch)
    queries = torch.arange(len(prompt) - 1, len(prompt) + len(target) - 1)  # logits at s − 1 predict the token at s
    leaf = {}
    original = modeling_llama.eager_attention_forward

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        out, weights = original(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if module is not llama.model.layers[-1].self_attn:
            return out, weights
        alpha = weights[0, :, queries].detach().clone().requires_grad_(True)  # [heads, steps, keys]
        leaf["alpha"] = alpha
        weights = weights.clone()
        weights[0, :, queries] = alpha
        values = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
        return (weights @ values).transpose(1, 2).contiguous(), weights

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", attention)
    logits = llama(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[0]
    score = logits[queries].log_softmax(-1).gather(-1, torch.tensor(target)[:, None]).sum()
    (grad,) = torch.autograd.grad(score, leaf["alpha"])
    source = torch.tensor([i < len(prompt) for i in range(len(prompt) + len(target))])
    expected = grad.sum((0, 1)) * source
    assert torch.allclose(gradient[0], expected, atol=1e-5, rtol=1e-4)
    assert torch.allclose(
        grad_x_attention[0], (grad * leaf["alpha"].detach()).sum((0, 1)) * source, atol=1e-5, rtol=1e-4
    )
    assert float(expected.abs().max()) > 1e-2


def test_permutations_of_a_single_source_token_are_the_identity_and_change_nothing(llama):
    model = HuggingFaceAdapter(llama)
    batch = batch_of([([7], [10, 11, 12])])
    found = generation_attention_baselines(model, batch, num_permutations=4, uniform=True)
    for key in ("log_prob_change", "abs_log_prob_change_per_token", "greedy_token_changed"):
        assert found[f"permutation/{key}"].abs().max() < 1e-5, key
        assert found[f"uniform/{key}"].abs().max() < 1e-5, key  # uniform over one token is the token itself


def test_permutations_are_drawn_per_row_whatever_the_batch(llama):
    model = HuggingFaceAdapter(llama)
    rows = [([5, 6, 7, 8], [10, 11]), ([9, 8, 7, 6, 5, 4], [12, 13, 14])]
    both = generation_attention_baselines(
        model,
        batch_of(rows),
        num_permutations=6,
        uniform=False,
        row_generators=[torch.Generator().manual_seed(s) for s in (3, 4)],
    )
    alone = generation_attention_baselines(
        model, batch_of(rows[1:]), num_permutations=6, uniform=False, row_generators=[torch.Generator().manual_seed(4)]
    )
    for key, value in both.items():
        assert float(value[1]) == pytest.approx(float(alone[key][0]), abs=1e-5), key
    assert float(both["permutation/abs_log_prob_change_per_token"].min()) > 1e-3


def test_permute_step_rows_moves_weights_only_among_the_source_tokens():
    rows = torch.rand(2, 3, 2, 6)
    mask = torch.tensor([[False, True, True, True, False, False], [False, True, True, False, False, False]])
    steps = torch.tensor([[True, True, True], [True, True, False]])
    out = permute_step_rows(rows, mask, steps, 5, [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)])
    for b in range(2):
        real = mask[b]
        assert torch.equal(out[:, b][..., ~real], rows[b][..., ~real].expand(5, -1, -1, -1))
        assert torch.allclose(
            out[:, b][..., real].sort(-1).values, rows[b][..., real].sort(-1).values.expand(5, -1, -1, -1)
        )
        # one permutation per step, shared by the heads: head 0's permutation (its values are distinct) moves head 1
        for n in range(5):
            for k in range(int(steps[b].sum())):
                source, moved = rows[b, k, 0][real], out[n, b, k, 0][real]
                perm = (moved[:, None] == source[None, :]).float().argmax(1)
                assert torch.equal(out[n, b, k, 1][real], rows[b, k, 1][real][perm])


def test_erasure_of_a_one_token_source_is_zero_and_never_flips(llama):
    model = HuggingFaceAdapter(llama)
    batch = batch_of([([7], [10, 11]), ([5, 6, 7, 8], [10, 11])])
    attention = model(batch).attention
    found = generation_erasure(model, batch, attention[None], [0.5], attention=attention)
    assert found["comprehensiveness"][0, 0, 0] == 0 and found["sufficiency"][0, 0, 0] == 0
    assert found["flipped"][0, 0] == 0 and torch.isnan(found["fraction_removed"][0, 0])
