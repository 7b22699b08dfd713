"""Value zeroing's fast path (only the block's tail re-run, only real pairs) against the whole-block re-run.

The whole-block re-run (``_rerun_matrix``: every zeroed copy through the block's own forward with the value
projection's output edited by a hook) is the general path, itself checked against a per-token loop over the whole
model in ``test_context_mixing.py``; here every family the fast path knows must give the same ``C^l`` at every
pair of real positions, and a family it does not know (Gemma's extra norms) must fall back to it.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")

from lightning_xai.adapters import HuggingFaceAdapter  # noqa: E402
from lightning_xai.attribution.context_mixing import _hf_internals, value_zeroing  # noqa: E402
from tests.adapters.test_families import DECODERS, family_batch, family_model  # noqa: E402

vz = importlib.import_module("lightning_xai.attribution.context_mixing.value_zeroing")  # the module, not the function

FAST = [
    ("bert", False),
    ("roberta", False),
    ("electra", False),
    ("distilbert", False),
    ("llama", False),
    ("llama", True),
    ("qwen2", True),
    ("gemma", False),
]


def gemma2():
    """Gemma 2 adds norms around the attention and the MLP that the Llama-family tail does not compute."""
    config = transformers.Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        pad_token_id=1,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.Gemma2ForSequenceClassification(config).double().eval()


def adapter_and_batch(name, left):
    model = gemma2() if name == "gemma2" else family_model(name)
    name = "gemma" if name == "gemma2" else name
    return HuggingFaceAdapter(model, query_index=-1 if name in DECODERS else 0), family_batch(name, left)


@pytest.mark.parametrize("name,left", FAST)
def test_tail_path_equals_the_whole_block_rerun(name, left):
    adapter, batch = adapter_and_batch(name, left)
    present = batch["attention_mask"].bool()
    pairs = present.unsqueeze(2) & present.unsqueeze(1)
    with torch.no_grad():
        tr = _hf_internals.trace(adapter, batch)
        for layer in range(len(tr.parts)):
            tail = _hf_internals.block_tail(tr.parts[layer])
            assert tail is not None and _hf_internals.tail_reproduces(tr, layer, tail)
            fast = vz.value_zeroing_matrix(tr, layer, present=present)
            slow = vz._rerun_matrix(tr, layer, None)
            assert torch.allclose(fast[pairs], slow[pairs], rtol=1e-9, atol=1e-12)
            assert fast[~pairs].abs().max() == 0
            assert fast[pairs].max() > 0  # the comparison is not between zeros
            chunked = vz.value_zeroing_matrix(tr, layer, internal_batch_size=1, present=present)
            assert torch.allclose(chunked, fast, rtol=1e-12, atol=1e-15)
            rows = torch.tensor([1, 3, 6])
            one_row = vz.value_zeroing_matrix(tr, layer, present=present, queries=rows)
            keep = torch.zeros_like(pairs)
            keep[torch.arange(3), rows] = pairs[torch.arange(3), rows]
            assert torch.allclose(one_row, fast.masked_fill(~keep, 0.0), rtol=1e-12, atol=1e-15)
            assert one_row[~keep].abs().max() == 0


@pytest.mark.parametrize("name,left", FAST)
def test_value_zeroing_never_reruns_a_known_block(name, left, monkeypatch):
    adapter, batch = adapter_and_batch(name, left)
    with torch.no_grad():
        expected = value_zeroing(adapter, batch)
        monkeypatch.setattr(vz, "_rerun_matrix", lambda *a, **k: pytest.fail("the whole block was re-run"))
        assert torch.allclose(value_zeroing(adapter, batch), expected, rtol=1e-12, atol=1e-15)


def test_a_block_the_tail_does_not_reproduce_falls_back(monkeypatch):
    """Gemma 2 normalises the attention output before the residual sum: the Llama tail is wrong for it, the check
    on the trace sees it and the whole block is re-run; a wrong tail forced on BERT is caught the same way."""
    calls = []
    rerun = vz._rerun_matrix
    monkeypatch.setattr(vz, "_rerun_matrix", lambda *a, **k: calls.append(a[1]) or rerun(*a, **k))
    adapter, batch = adapter_and_batch("gemma2", False)
    with torch.no_grad():
        tr = _hf_internals.trace(adapter, batch)
        tail = _hf_internals.block_tail(tr.parts[0])
        assert tail is not None and not _hf_internals.tail_reproduces(tr, 0, tail)
        scores = value_zeroing(adapter, batch)
    assert calls == [0, 1] and torch.isfinite(scores).all()

    adapter, batch = adapter_and_batch("bert", False)
    with torch.no_grad():
        expected = value_zeroing(adapter, batch)
        calls.clear()
        monkeypatch.setattr(vz, "block_tail", lambda parts: lambda x, o: x + o)
        assert torch.allclose(value_zeroing(adapter, batch), expected, rtol=1e-9, atol=1e-12)
    assert calls == [0, 1]


def test_the_tail_is_not_trusted_in_training_mode():
    """Dropout after the output projection makes the recorded output differ from the tail's: re-run instead."""
    adapter, batch = adapter_and_batch("bert", False)
    adapter.model.config.hidden_dropout_prob = 0.5
    for module in adapter.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
    adapter.model.train()
    torch.manual_seed(0)
    with torch.no_grad():
        tr = _hf_internals.trace(adapter, batch)
    assert not _hf_internals.tail_reproduces(tr, 0, _hf_internals.block_tail(tr.parts[0]))
