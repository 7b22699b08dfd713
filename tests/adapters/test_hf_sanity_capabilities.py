"""HuggingFaceAdapter under the saliency sanity checks: Kindermans et al.'s compensated input shift
(``adapters/huggingface/shift.py``) and Adebayo et al.'s cascade of layers (``parts.randomization_stages``), on tiny
random ``transformers`` classifiers, checked against the models' own forward passes and hand autograd."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.adapters.huggingface.shift import shift_input_embeddings
from lightning_xai.attribution import attribute
from lightning_xai.audits import model_randomization
from lightning_xai.audits.input_invariance import input_invariance, input_shift_refusal, shifted_model

SMALL = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=50)


def classifier(family: str):
    torch.manual_seed(0)
    models = {
        "bert": lambda: tf.BertForSequenceClassification(tf.BertConfig(**SMALL)),
        "roberta": lambda: tf.RobertaForSequenceClassification(tf.RobertaConfig(**SMALL)),
        "distilbert": lambda: tf.DistilBertForSequenceClassification(
            tf.DistilBertConfig(vocab_size=50, dim=16, n_layers=2, n_heads=2, hidden_dim=32)
        ),
        "albert": lambda: tf.AlbertForSequenceClassification(tf.AlbertConfig(embedding_size=8, **SMALL)),
        "gpt2": lambda: tf.GPT2ForSequenceClassification(
            tf.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, pad_token_id=0, bos_token_id=1, eos_token_id=1)
        ),
        "llama": lambda: tf.LlamaForSequenceClassification(tf.LlamaConfig(pad_token_id=0, **SMALL)),
    }
    return models[family]().double().eval()


BATCH = {
    "input_ids": torch.tensor([[5, 7, 9, 11, 13, 3], [5, 8, 10, 3, 0, 0]]),
    "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]),
    "mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]).bool(),
}


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "albert", "gpt2"])
def test_a_compensated_shift_keeps_the_logits_and_moves_only_the_inputs(family):
    adapter = HuggingFaceAdapter(classifier(family))
    shift = torch.linspace(-0.5, 0.7, 16 if family != "albert" else 8, dtype=torch.float64)
    assert input_shift_refusal(adapter) is None
    other = shifted_model(adapter, shift)
    with torch.no_grad():
        torch.testing.assert_close(other(BATCH).logits, adapter(BATCH).logits, rtol=0, atol=1e-10)
        torch.testing.assert_close(other.embed(BATCH), adapter.embed(BATCH) + shift, rtol=0, atol=1e-12)
    assert torch.equal(adapter.embedding_table(), adapter.model.get_input_embeddings().weight)  # the original kept
    # the gradient is the same function's, so it does not move; grad × input moves by exactly grad · shift
    gradient = attribute(adapter, BATCH, "grad_x_input", output="logit") - attribute(
        other, BATCH, "grad_x_input", output="logit"
    )
    embeddings = adapter.embed(BATCH).detach().requires_grad_(True)
    out = adapter.forward_from_embeddings(embeddings, BATCH)
    picked = out.logits.gather(1, out.logits.argmax(1, keepdim=True)).sum()
    (grad,) = torch.autograd.grad(picked, embeddings)
    torch.testing.assert_close(gradient, -(grad * shift).sum(-1) * BATCH["mask"], rtol=1e-6, atol=1e-9)


def test_input_invariance_runs_on_a_transformers_classifier_and_grad_x_input_fails_it():
    table = input_invariance(HuggingFaceAdapter(classifier("bert")), BATCH, methods=["gradient", "grad_x_input"])
    passes = {row["method"]: row["passes"] for row in table.rows}
    # the shifted copy computes the same logits; Kindermans et al.'s finding, on a transformer
    assert passes == {"model (logits)": True, "gradient": True, "grad_x_input": False}


def test_a_model_with_no_additive_embedding_table_is_refused_by_name_before_any_copy():
    adapter = HuggingFaceAdapter(classifier("llama"))
    refusal = input_shift_refusal(adapter)
    assert refusal is not None and "LlamaForSequenceClassification adds no position or token-type" in refusal
    with pytest.raises(ValueError, match="cannot be compensated inside the model"):
        shifted_model(adapter, 0.5)


def test_a_tied_language_model_head_is_untied_so_its_logits_do_not_move():
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2)).double().eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.tensor([[3, 4, 5, 6]])
    before = model(input_ids=ids).logits
    shift_input_embeddings(model, model.get_input_embeddings(), torch.full((16,), 0.3, dtype=torch.float64))
    assert model.lm_head.weight is not model.transformer.wte.weight
    torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "family, expected",
    [
        (
            "bert",
            ["model.classifier", "model.bert.pooler", "model.bert.encoder.layer.1", "model.bert.encoder.layer.0"]
            + ["model.bert.embeddings"],
        ),
        (
            "llama",
            ["model.score", "model.model.norm", "model.model.layers.1", "model.model.layers.0"]
            + ["model.model.embed_tokens"],
        ),
        (
            "distilbert",
            ["model.pre_classifier", "model.classifier", "model.distilbert.transformer.layer.1"]
            + ["model.distilbert.transformer.layer.0", "model.distilbert.embeddings"],
        ),
    ],
)
def test_the_randomisation_cascade_runs_from_the_head_down_through_every_layer(family, expected):
    adapter = HuggingFaceAdapter(classifier(family))
    assert adapter.randomization_layers() == expected
    table = model_randomization(adapter, BATCH, ["gradient"])
    stages = table.column("stage")
    assert stages[0] == expected[0] and stages[-1] == "+" + expected[-1]
    # Llama's RMSNorm has no reset_parameters: its stage re-initialises nothing and is left out, by name
    assert [s.lstrip("+") for s in stages] == [n for n in expected if not n.endswith(".norm")]
