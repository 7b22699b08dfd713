"""HuggingFaceAdapter on generators (issue #31): tiny random causal LMs and encoder–decoders, float64, padded
batches, every explanation checked against the model's own forward passes (hand autograd, re-runs, its own
``output_attentions``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_xai.adapters import ExplainableModel, HuggingFaceAdapter, explainable_model
from lightning_xai.adapters.capabilities import TargetSequence
from lightning_xai.adapters.huggingface import HuggingFaceGenerationAdapter
from lightning_xai.adapters.protocol import ProtocolError
from lightning_xai.attribution import attribute, resolve_target, target_score
from tests.adapters.generators import (
    CAUSAL,
    SEQ2SEQ,
    causal_batch,
    causal_lm,
    hand_gradient,
    make,
    own_log_probs,
    source_mask,
)


# --- the adapter is found and speaks the protocol ------------------------------------------------------------
@pytest.mark.parametrize("family", CAUSAL + SEQ2SEQ)
def test_generators_are_found_and_their_logits_are_the_models_own(family):
    model, batch = make(family)
    holder = nn.ModuleDict({"net": model})
    adapter = explainable_model(holder)
    assert type(adapter) is HuggingFaceGenerationAdapter and isinstance(adapter, HuggingFaceAdapter)
    assert isinstance(adapter, ExplainableModel) and isinstance(adapter, TargetSequence)
    assert adapter.check_logits(batch) <= 1e-10  # the adapter's passes from embeddings are the model's own
    assert torch.equal(adapter.token_mask(batch), source_mask(model, batch))
    out = adapter(batch)
    torch.testing.assert_close(target_score(out, resolve_target(out, None)), own_log_probs(model, batch))
    assert out.target_steps.tolist() == [
        [True] * out.target_steps.shape[1],
        (batch["labels"][1] != -100).sum() * [True]
        + [False] * (out.target_steps.shape[1] - (batch["labels"][1] != -100).sum()),
    ]


def test_classifiers_do_not_claim_the_generation_capability(make_tiny_bert):
    adapter = HuggingFaceAdapter(make_tiny_bert())
    assert type(adapter) is HuggingFaceAdapter and not isinstance(adapter, TargetSequence)


# --- gradients: hand autograd of Σ log p(target) -------------------------------------------------------------
@pytest.mark.parametrize("family", CAUSAL + SEQ2SEQ)
def test_summed_target_gradient_maps_equal_hand_autograd(family):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    grad, embeddings = hand_gradient(model, batch)
    mask = source_mask(model, batch)
    scale = adapter._embedding_scale  # Marian's encoder scales looked-up embeddings: x = s·e, ∂/∂x = (∂/∂e)/s
    expected_gxi = (grad * embeddings).sum(-1) * mask
    expected_norm = (grad.norm(dim=-1) / scale) * mask
    torch.testing.assert_close(attribute(adapter, batch, "grad_x_input"), expected_gxi, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(attribute(adapter, batch, "gradient"), expected_norm, rtol=1e-9, atol=1e-12)
    assert torch.all(attribute(adapter, batch, "gradient")[~mask] == 0)  # target tokens, specials, pads


@pytest.mark.filterwarnings("ignore:Integrated gradients. convergence delta")  # 16 fixed nodes: linear, not exact
@pytest.mark.parametrize("family", ("llama", "bart", "t5", "encoder_decoder"))
def test_per_step_maps_sum_to_the_summed_target_map(family):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    for method, options in (("grad_x_input", {}), ("integrated_gradients", {"n_steps": 16})):
        whole = attribute(adapter, batch, method, **options)
        steps = attribute(adapter, batch, method, target="steps", **options)
        K = (batch["labels"] != -100).sum(1).max()
        assert steps.shape == (2, K, batch["input_ids"].shape[1])
        # Llama's eager attention takes its softmax in float32: sums of separately computed maps agree to ~1e-7
        torch.testing.assert_close(steps.sum(1), whole, rtol=1e-5, atol=1e-9)
        assert torch.all(steps[1, int((batch["labels"][1] != -100).sum()) :] == 0)  # steps row 1 does not have
        first = attribute(adapter, batch, method, target=0, **options)
        torch.testing.assert_close(steps[:, 0], first)


def test_one_step_gradient_is_the_gradient_of_that_tokens_log_probability():
    model, batch = make("llama")
    adapter = HuggingFaceAdapter(model)
    embeddings = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    logits = model(inputs_embeds=embeddings, attention_mask=batch["attention_mask"]).logits
    # step 1 of row 0 is the token at position 6 (read at 5); of row 1 the token at 4 (read at 3)
    score = logits[0, 5].log_softmax(-1)[10] + logits[1, 3].log_softmax(-1)[14]
    (grad,) = torch.autograd.grad(score, embeddings)
    expected = (grad * embeddings.detach()).sum(-1) * source_mask(model, batch)
    torch.testing.assert_close(attribute(adapter, batch, "grad_x_input", target=1), expected)


def test_integrated_gradients_completeness_over_the_source():
    model, batch = make("qwen2")
    adapter = HuggingFaceAdapter(model)
    scores, delta = attribute(adapter, batch, "integrated_gradients", n_steps="auto", return_convergence_delta=True)
    mask = source_mask(model, batch)
    embeddings = model.get_input_embeddings()(batch["input_ids"])
    with torch.no_grad():  # the zero baseline moves the prompt tokens only; target tokens keep their embeddings
        gap = own_log_probs(model, batch) - own_log_probs(model, batch, embeddings.masked_fill(mask[..., None], 0.0))
    torch.testing.assert_close(scores.sum(1), gap, rtol=1e-2, atol=1e-6)
    assert bool((delta.abs() <= 1e-2 * gap.abs() + 1e-6).all())


def test_captum_objects_explain_the_target_log_probability():
    captum = pytest.importorskip("captum.attr")
    model, batch = make("gpt2")
    adapter = HuggingFaceAdapter(model)
    torch.testing.assert_close(
        attribute(adapter, batch, captum.InputXGradient(lambda x: x)), attribute(adapter, batch, "grad_x_input")
    )


# --- leave-one-out: re-run the model on each shortened source ------------------------------------------------
@pytest.mark.parametrize("family", ("llama", "gpt2") + SEQ2SEQ)
def test_leave_one_out_equals_rerunning_each_shortened_source(family):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    scores = attribute(adapter, batch, "leave_one_out", signed=True)
    mask = source_mask(model, batch)
    with torch.no_grad():
        full = own_log_probs(model, batch)
        for b, p in mask.nonzero().tolist():
            width = int(batch["attention_mask"][b].sum()) if not model.config.is_encoder_decoder else None
            keep = [i for i in range(batch["input_ids"].shape[1]) if i != p]
            row = {
                "input_ids": batch["input_ids"][b : b + 1, keep],
                "attention_mask": batch["attention_mask"][b : b + 1, keep],
            }
            row["labels"] = batch["labels"][b : b + 1, keep] if width is not None else batch["labels"][b : b + 1]
            expected = full[b] - own_log_probs(model, row)[0]
            torch.testing.assert_close(scores[b, p], expected, rtol=1e-8, atol=1e-10)
    assert torch.all(scores[~mask] == 0)


def test_target_keys_keep_an_encoder_decoder_target_as_wide_as_its_source():
    from lightning_xai.attribution import occlusion_batch

    model, batch = make("bart")
    adapter = HuggingFaceAdapter(model)
    assert adapter.target_keys(batch) == ("labels",) and HuggingFaceAdapter(causal_lm("llama")).target_keys(batch) == ()
    variant = occlusion_batch(batch, torch.tensor([0]), torch.tensor([1]), 2, keep=adapter.target_keys(batch))
    assert torch.equal(variant["labels"], batch["labels"][:1]) and variant["input_ids"].shape == (1, 4)


# --- attention: each step's row of the model's own maps --------------------------------------------------------
def _own_row(model, batch, b, query, layer=-1, head=None):
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "output_attentions": True}
    if model.config.is_encoder_decoder:
        kwargs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
        maps = model(**kwargs).cross_attentions[layer]
    else:
        maps = model(**kwargs).attentions[layer]
    row = maps[b, :, query].mean(0) if head is None else maps[b, head, query]
    mask = source_mask(model, batch)[b]
    row = row * mask
    return row / row.sum()


@pytest.mark.parametrize("family", CAUSAL + SEQ2SEQ)
@pytest.mark.parametrize("reduction", ("cls_last_mean", "0:1"))
def test_step_attention_is_the_models_own_row_for_that_step(family, reduction):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model, attention=reduction)
    layer, head = (-1, None) if reduction == "cls_last_mean" else (0, 1)
    with torch.no_grad():
        out = adapter(batch)
        for b in range(2):
            positions = (batch["labels"][b] != -100).nonzero().flatten().tolist()
            for k, s in enumerate(positions):
                query = s if model.config.is_encoder_decoder else s - 1
                torch.testing.assert_close(
                    out.extras["step_attention"][b, k], _own_row(model, batch, b, query, layer, head)
                )
            torch.testing.assert_close(out.attention[b], out.extras["step_attention"][b, : len(positions)].mean(0))
        step_one = attribute(adapter, batch, "attention", target=1)
    torch.testing.assert_close(step_one, out.extras["step_attention"][:, 1])


def test_a_reduction_of_another_shape_is_refused_at_every_step_map():
    model, batch = make("llama")
    head_maps = lambda raw, b: raw[-1][:, :, 0]  # noqa: E731  # [B, heads, T]: not one map per row
    with pytest.raises(ValueError, match=r"reduction returned shape \(2, \d+, \d+\); expected \(2, \d+\)"):
        HuggingFaceAdapter(model, attention=head_maps)(batch)


@pytest.mark.parametrize("family", CAUSAL + SEQ2SEQ)
def test_override_with_the_models_own_rows_reproduces_its_logits_exactly(family):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    with torch.no_grad():
        out = adapter(batch)
        again = adapter(batch, attention_override=out.extras["step_rows"])
        uniform = source_mask(model, batch).double()
        changed = adapter(batch, attention_override=uniform / uniform.sum(1, keepdim=True))
    assert torch.equal(again.logits, out.logits)
    queries = adapter.query_mask(batch)
    assert not torch.allclose(changed.logits[queries], out.logits[queries])  # the override acts on the step rows
    if not model.config.is_encoder_decoder:  # ... of the last layer only: no other position's logits move
        assert torch.equal(changed.logits[~queries], out.logits[~queries])


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_rollout_is_refused_for_an_encoder_decoder_even_where_source_and_target_are_as_long(family):
    model, batch = make(family)
    assert batch["input_ids"].shape == batch["labels"].shape  # cross-attention maps are square here: no shape error
    with pytest.raises(ValueError, match=rf"'rollout' is not defined for {type(model).__name__} .*cross-attention"):
        HuggingFaceAdapter(model, attention="rollout")
    rolled = HuggingFaceAdapter(causal_lm("llama"), attention="rollout")(causal_batch()).attention  # causal: fine
    assert torch.allclose(rolled.sum(1), torch.ones(2, dtype=rolled.dtype))


@pytest.mark.parametrize("family", ("llama", "t5", "encoder_decoder"))
@pytest.mark.parametrize("method", ("alti", "attention_norm", "value_zeroing", "attnlrp"))
def test_context_mixing_methods_refuse_generators_by_name(family, method):
    model, batch = make(family)
    with pytest.raises(ProtocolError, match=rf"do not explain generators: {type(model).__name__} .*query row"):
        attribute(HuggingFaceAdapter(model), batch, method)


def _hand_grad_attention(model, batch, step=None):
    """Chefer et al.'s self-attention rule through the model's own forward and ``output_attentions``: R over every
    position from ∂ Σ log p(target) (or one step's) / ∂ each layer's attention; the explained steps' query rows."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=True)
    labels = batch["labels"][:, 1:]
    picked = out.logits[:, :-1].log_softmax(-1).gather(-1, labels.clamp_min(0)[..., None]).squeeze(-1)
    explained = labels != -100
    if step is not None:  # the step-th target token of each row
        explained = explained & (explained.long().cumsum(1) == step + 1)
    score = (picked * explained).sum()
    grads = torch.autograd.grad(score, out.attentions)
    T = batch["input_ids"].shape[1]
    relevance = torch.eye(T, dtype=torch.float64).expand(2, T, T)
    for attention, grad in zip(out.attentions, grads):
        relevance = relevance + (grad * attention).clamp_min(0).mean(1) @ relevance
    rows = (relevance[:, :-1] * explained[..., None]).sum(1)  # query s − 1 reads the token at s
    return rows * source_mask(model, batch)


@pytest.mark.parametrize("family", CAUSAL)
def test_grad_attention_on_a_causal_lm_is_chefers_rule_over_the_target_steps_query_rows(family):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    torch.testing.assert_close(attribute(adapter, batch, "grad_attention"), _hand_grad_attention(model, batch))
    torch.testing.assert_close(
        attribute(adapter, batch, "grad_attention", target=1), _hand_grad_attention(model, batch, step=1)
    )
    steps = attribute(adapter, batch, "grad_attention", target="steps")
    torch.testing.assert_close(steps[:, 0], _hand_grad_attention(model, batch, step=0))


@pytest.mark.parametrize("family", ("t5", "bart"))
def test_grad_attention_refuses_an_encoder_decoder_by_name(family):
    model, batch = make(family)
    with pytest.raises(ProtocolError, match=rf"does not explain encoder–decoders: {type(model).__name__} .*cross"):
        attribute(HuggingFaceAdapter(model), batch, "grad_attention")


def test_a_generation_model_loaded_with_sdpa_is_explained_on_eager_and_keeps_sdpa():
    model = causal_lm("llama", attn_implementation="sdpa")
    batch = causal_batch()
    adapter = HuggingFaceAdapter(model)
    reference = HuggingFaceAdapter(causal_lm("llama"))
    torch.testing.assert_close(attribute(adapter, batch, "attention"), attribute(reference, batch, "attention"))
    assert model.config._attn_implementation == "sdpa"


# --- what is explained: a log-probability, never a softmax over classes ----------------------------------------
def test_output_semantics_for_generation():
    model, batch = make("llama")
    adapter = HuggingFaceAdapter(model)
    out = adapter(batch)
    whole = resolve_target(out, None)
    assert whole.tolist() == [-1, -1]
    log_p = own_log_probs(model, batch)
    torch.testing.assert_close(target_score(out, whole, "log_probability"), log_p)
    torch.testing.assert_close(target_score(out, whole, "probability"), log_p.exp())
    with pytest.raises(ValueError, match="output='logit' has no meaning"):
        attribute(adapter, batch, "gradient", output="logit")
    with pytest.raises(ValueError, match=r"target steps \[2\] do not exist in rows \[0, 1\]"):
        attribute(adapter, batch, "gradient", target=2)
    with pytest.raises(ValueError, match="have a target token at position 0"):
        adapter({**batch, "labels": batch["input_ids"]})
    with pytest.raises(KeyError, match="greedy_targets"):
        adapter({k: v for k, v in batch.items() if k != "labels"})


def test_steps_target_is_refused_for_a_classifier(make_tiny_bert, batch):
    with pytest.raises(ValueError, match="explains classes"):
        attribute(HuggingFaceAdapter(make_tiny_bert()), batch, "gradient", target="steps")


# --- free decoding ---------------------------------------------------------------------------------------------
def test_greedy_targets_of_a_causal_lm_are_transformers_greedy_generation():
    model = causal_lm("llama")
    adapter = HuggingFaceAdapter(model)
    prompt = {"input_ids": torch.tensor([[1, 5, 6, 7]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    freed = adapter.greedy_targets(prompt, max_new_tokens=5)
    generated = model.generate(**prompt, max_new_tokens=5, do_sample=False, eos_token_id=2, pad_token_id=0)
    n = freed["input_ids"].shape[1]
    assert torch.equal(freed["input_ids"], generated[:, :n])
    assert freed["labels"][0, :4].tolist() == [-100] * 4 and torch.equal(freed["labels"][0, 4:], generated[0, 4:n])


@pytest.mark.parametrize("family", ("qwen2", "bart", "t5", "encoder_decoder"))
def test_greedy_targets_are_the_argmax_of_the_explained_log_probabilities(family):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    freed = adapter.greedy_targets(batch, max_new_tokens=4)
    with torch.no_grad():
        out = adapter(freed)
    steps = out.target_steps
    best = out.logits.log_softmax(-1).amax(-1)
    queries = out.extras["step_queries"]
    chosen = best.gather(1, queries)
    torch.testing.assert_close(out.target_log_probs[steps], chosen[steps])
    if not model.config.is_encoder_decoder:  # the prompt is kept: same source tokens, right-padded
        assert torch.equal(adapter.token_mask(freed).sum(1), source_mask(model, batch).sum(1))


def test_a_users_subclass_of_the_adapter_never_claims_other_models(make_tiny_bert):
    class Mine(HuggingFaceAdapter):
        pass

    assert type(HuggingFaceAdapter(make_tiny_bert())) is HuggingFaceAdapter  # Mine does not hijack the dispatch
    assert type(Mine(make_tiny_bert())) is Mine
    assert type(HuggingFaceAdapter(causal_lm("gpt2"))) is HuggingFaceGenerationAdapter
