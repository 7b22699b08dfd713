"""AttnLRP (issue 16): conservation on bias-free tiny BERT / Llama, LXT's own maps as the oracle, the patching contract.

Oracles: (1) conservation — the token relevance plus what the bias terms absorb is the target logit (the delta of
``return_convergence_delta``), within 1% and to float rounding, on tiny BERT and Llama classifiers with every bias
zeroed and with their biases; (2) the maps of LXT 2.1's efficient AttnLRP (the authors' library, run once in a
separate environment by ``lxt_reference/make_reference.py``) on the same weights.
"""

from __future__ import annotations

import os

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter, ProtocolError
from lightning_xai.attribution import attribute
from lightning_xai.attribution.context_mixing.attnlrp import attnlrp, attnlrp_absorbed

transformers = pytest.importorskip("transformers")
from tests.adapters.test_families import family_batch, family_model  # noqa: E402

REFERENCE = os.path.join(os.path.dirname(__file__), "lxt_reference", "attnlrp_lxt.pt")


def _zero_biases(model: torch.nn.Module) -> int:
    count = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
                count += 1
    return count


@pytest.mark.parametrize("family", ["bert", "llama"])
@pytest.mark.parametrize("bias_free", [True, False])
def test_relevance_is_conserved_up_to_the_bias_terms(family, bias_free):
    model = family_model(family)
    if bias_free:
        zeroed = _zero_biases(model)
        assert zeroed > 0 if family == "bert" else zeroed == 0  # Llama has no bias at all
    adapter = HuggingFaceAdapter(model)
    batch = family_batch(family, left=False)  # three rows, padded
    tokens, logit, absorbed = attnlrp_absorbed(adapter, batch, target=batch["labels"])
    gap = (tokens + absorbed - logit).abs()
    assert bool((gap <= 0.01 * logit.abs()).all()), (gap, logit)  # the acceptance: within 1%
    assert float(gap.max()) < 1e-7  # float64 model (Llama's softmax runs in float32): rounding only
    # the softmax rule is not conservative on its own: even without biases the tokens do not add up to the logit
    assert float((tokens - logit).abs().max()) > 1e-4
    relevance, delta = attribute(adapter, batch, "attnlrp", target=batch["labels"], return_convergence_delta=True)
    assert torch.allclose(delta, tokens + absorbed - logit, atol=1e-12)
    assert float(relevance.masked_fill(batch["mask"], 0).abs().max()) == 0.0  # attribute() keeps real tokens only


@pytest.mark.parametrize(
    "family", ["roberta", "xlm-roberta", "electra", "distilbert", "qwen2", "mistral", "qwen3", "gemma"]
)
def test_every_supported_family_conserves_relevance(family):
    adapter = HuggingFaceAdapter(family_model(family))
    batch = family_batch(family, left=family in ("qwen2", "mistral", "qwen3", "gemma"))
    relevance, delta = attnlrp(adapter, batch, batch["labels"], return_convergence_delta=True)
    assert bool(torch.isfinite(relevance).all()) and float(delta.abs().max()) < 1e-7, delta


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_maps_match_lxt_efficient_attnlrp(family):
    reference = torch.load(REFERENCE, weights_only=True)[family]
    config_class = transformers.BertConfig if family == "bert" else transformers.LlamaConfig
    model_class = (
        transformers.BertForSequenceClassification if family == "bert" else transformers.LlamaForSequenceClassification
    )
    config = config_class(**{k: v for k, v in reference["config"].items() if k != "transformers_version"})
    config._attn_implementation = "eager"
    model = model_class(config).double().eval()
    model.load_state_dict(reference["state"])
    ids = reference["ids"]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mask": torch.ones_like(ids).bool()}
    if family == "bert":
        batch["token_type_ids"] = torch.zeros_like(ids)
    adapter = HuggingFaceAdapter(model)
    with torch.no_grad():
        assert torch.allclose(adapter(batch).logits, reference["logits"], atol=1e-12, rtol=0)
    relevance = attnlrp(adapter, batch, torch.ones(len(ids), dtype=torch.long))
    scale = float(reference["relevance"].abs().max())
    assert float((relevance - reference["relevance"]).abs().max()) <= 1e-6 * scale, (relevance, reference["relevance"])


def test_rules_leave_the_model_as_it_was():
    model = family_model("roberta")  # functional tanh in the head, GELU modules, LayerNorms, biases
    adapter = HuggingFaceAdapter(model)
    batch = family_batch("roberta", left=False)

    def hooks():  # transformers keeps its own output-recording hooks on some modules
        return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]

    with torch.no_grad():
        before, own = adapter(batch).logits, hooks()
    relevance, delta = attnlrp(adapter, batch, batch["labels"], return_convergence_delta=True)
    assert float(delta.abs().max()) < 1e-9 and bool(torch.isfinite(relevance).all())
    assert hooks() == own
    with torch.no_grad():
        assert torch.equal(adapter(batch).logits, before)


def test_map_differs_from_plain_gradient_x_input():
    adapter = HuggingFaceAdapter(family_model("llama"))
    batch = family_batch("llama", left=True)
    lrp = attnlrp(adapter, batch, batch["labels"])
    embeddings = adapter.embed(batch).detach().requires_grad_(True)
    logit = adapter.forward_from_embeddings(embeddings, batch).logits.gather(1, batch["labels"][:, None]).sum()
    (grad,) = torch.autograd.grad(logit, embeddings)
    plain = (embeddings * grad).sum(-1).detach()
    assert float((lrp - plain).abs().max()) > 1e-3 * float(plain.abs().max())


def test_create_graph_makes_the_map_differentiable_in_the_parameters():
    model = family_model("bert")
    adapter = HuggingFaceAdapter(model)
    batch = family_batch("bert", left=False)
    relevance = attribute(adapter, batch, "attnlrp", target=batch["labels"], create_graph=True, normalize=None)
    weight = model.bert.encoder.layer[0].intermediate.dense.weight
    (grad,) = torch.autograd.grad(relevance.pow(2).sum(), weight)
    assert bool(torch.isfinite(grad).all()) and float(grad.abs().sum()) > 0


@pytest.mark.parametrize("family", ["gpt2", "phi3", "albert"])
def test_other_families_are_refused_by_name(family):
    adapter = HuggingFaceAdapter(family_model(family))
    batch = family_batch(family, left=False)
    with pytest.raises(ProtocolError, match=f"BERT family.*Llama family.*model_type='{family}'"):
        attribute(adapter, batch, "attnlrp")
