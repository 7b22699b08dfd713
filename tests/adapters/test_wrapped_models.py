"""Classifiers as users fine-tune them: PEFT (LoRA, IA3, ``modules_to_save`` heads), gradient checkpointing,
``torch.compile``. The adapter is found with no options and explains what the merged model explains.

Oracle: ``merge_and_unload()`` folds the adapter layers into plain weights, so the merged model is the same function
written without PEFT; its adapter's maps (gradient, attention) must equal the wrapped model's to 1e-5 (float64).
``torch.compile`` runs with ``backend="eager"`` (no C++ toolchain needed on CPU; the adapter explains ``_orig_mod``
either way).
"""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter, ProtocolError, explainable_model
from lightning_xai.adapters.checks import check_logits
from lightning_xai.adapters.resolve import ModelResolver
from lightning_xai.attribution import attribute
from tests.adapters.test_families import family_batch, family_model

peft = pytest.importorskip("peft")
from peft import IA3Config, LoraConfig, PrefixTuningConfig, get_peft_model  # noqa: E402

TARGETS = {"bert": ["query", "value"], "llama": ["q_proj", "v_proj"]}


def wrapped(family: str, method: str = "lora", checkpointing: bool = False, compiled: bool = False):
    """``(the module a user trains, its merged twin)``: random non-zero adapter weights and a moved head copy."""
    model = family_model(family)
    if checkpointing:
        model.gradient_checkpointing_enable()
    if method == "lora":
        config = LoraConfig(
            task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=TARGETS[family], init_lora_weights=False
        )
    else:
        config = IA3Config(task_type="SEQ_CLS", target_modules=TARGETS[family], feedforward_modules=[])
    torch.manual_seed(3)
    net = get_peft_model(model, config).double()
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            if "modules_to_save" in name or "ia3_" in name:  # the trained head copy and IA3's scales move
                parameter.add_(0.1 * torch.randn_like(parameter))
    merged = copy.deepcopy(net).merge_and_unload().eval()
    net.eval()
    return (torch.compile(net, backend="eager") if compiled else net), merged


def maps(adapter, batch):
    gradient = attribute(adapter, batch, "gradient", target=batch["labels"])
    with torch.no_grad():
        out = adapter(batch)
    return gradient, out.attention, out.logits


def gradient_of(adapter, batch):
    embeddings = adapter.embed(batch).detach().requires_grad_(True)
    adapter.forward_from_embeddings(embeddings, batch).logits.gather(1, batch["labels"][:, None]).sum().backward()
    return embeddings.grad


CASES = [("bert", False), ("llama", False), ("llama", True)]
WRAPPINGS = [("lora", False, False), ("lora", True, False), ("lora", False, True), ("ia3", True, True)]


@pytest.mark.parametrize(
    "method,checkpointing,compiled",
    WRAPPINGS,
    ids=["lora", "lora-checkpointing", "lora-compiled", "ia3-checkpointing-compiled"],
)
@pytest.mark.parametrize("family,left", CASES, ids=["bert-right", "llama-right", "llama-left"])
def test_wrapped_classifier_is_found_and_explained_as_its_merged_model(family, left, method, checkpointing, compiled):
    net, merged = wrapped(family, method, checkpointing, compiled)
    batch = family_batch(family, left)
    holder = torch.nn.ModuleDict({"net": net})  # a LightningModule holding the model it trains
    adapter = explainable_model(holder)  # no options
    peft_model = net._orig_mod if compiled else net
    assert isinstance(adapter, HuggingFaceAdapter) and adapter.model is peft_model.get_base_model()
    assert adapter.reference is peft_model and adapter.wrappers[-1] == "PeftModelForSequenceClassification"
    assert adapter.pooling == ("first" if family == "bert" else "last")
    assert check_logits(adapter, batch) < 1e-9
    gradient, attention, logits = maps(adapter, batch)
    twin_gradient, twin_attention, twin_logits = maps(HuggingFaceAdapter(merged), batch)
    with torch.no_grad():  # the adapter layers change the function: the comparison is not between equal weights
        plain = HuggingFaceAdapter(family_model(family))(batch).logits
    assert float((plain - twin_logits).abs().max()) > 1e-3
    torch.testing.assert_close(logits, twin_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(gradient, twin_gradient, atol=1e-5, rtol=0)
    torch.testing.assert_close(attention, twin_attention, atol=1e-5, rtol=0)
    if checkpointing:  # in training mode the layers run checkpointed; no dropout here, so the same function
        peft_model.train()
        embeddings = adapter.embed(batch).detach().requires_grad_(True)
        trained = adapter.forward_from_embeddings(embeddings, batch).logits
        trained.gather(1, batch["labels"][:, None]).sum().backward()
        peft_model.eval()
        torch.testing.assert_close(trained.detach(), twin_logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(embeddings.grad, gradient_of(HuggingFaceAdapter(merged), batch), atol=1e-5, rtol=0)
    if family == "llama":  # each row's last real token, left or right padding
        out = adapter(batch)
        expected = torch.tensor([7, 7, 7]) if left else torch.tensor([6, 4, 3])
        assert torch.equal(out.extras["query_positions"], expected)


def test_the_peft_head_is_read_by_what_it_does():
    """``score`` becomes peft's ModulesToSaveWrapper (not an nn.Linear): before, the adapter refused the model."""
    net, _ = wrapped("llama")
    inner = net.get_base_model()
    assert not isinstance(inner.score, torch.nn.Linear)
    assert HuggingFaceAdapter(inner).pooling == "last" and HuggingFaceAdapter(net).pooling == "last"


def test_a_wrong_query_index_fails_the_logits_self_check_with_the_fix():
    """Right padding: query_index=-1 reads a pad for two rows; the self-check names the mismatch and the fix."""
    net, _ = wrapped("llama")
    batch = family_batch("llama", left=False)
    adapter = explainable_model(torch.nn.ModuleDict({"net": net}), query_index=-1)
    assert adapter.query_index == -1
    with pytest.raises(
        ValueError,
        match=r"logits differ from PeftModelForSequenceClassification's own by .* "
        r"query_index=-1.*leave it None",
    ):
        check_logits(adapter, batch)
    assert check_logits(adapter, family_batch("llama", left=True)) < 1e-9  # left padding: -1 is the last token


def test_adapter_options_travel_in_a_model_spec_mapping():
    net, _ = wrapped("llama")
    holder = torch.nn.ModuleDict({"net": net})
    adapter = ModelResolver({"model": "net", "query_index": -1, "attention": "rollout"})(holder)
    assert adapter.query_index == -1 and adapter.attention_name == "rollout" and adapter.reference is net
    assert ModelResolver(options={"check": False})(holder)._checked
    with pytest.raises(TypeError, match=r"unknown adapter option 'query_idx' \(did you mean 'query_index'\?\)"):
        ModelResolver({"query_idx": 0})
    with pytest.raises(TypeError, match=r"unknown adapter option 'querry_index'"):
        explainable_model(holder, querry_index=0)


def test_prompt_learning_is_refused_by_name():
    net = get_peft_model(family_model("bert"), PrefixTuningConfig(task_type="SEQ_CLS", num_virtual_tokens=2))
    with pytest.raises(ProtocolError, match=r"uses PREFIX_TUNING \(prompt learning\).*virtual tokens"):
        explainable_model(torch.nn.ModuleDict({"net": net}))
