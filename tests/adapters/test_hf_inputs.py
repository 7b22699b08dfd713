"""Issue 30 item 4: a batch that disagrees with itself or with the model gets a clear error or a warning, not a map.

Before: an ``attention_mask`` wider or narrower than ``input_ids``, or all 0 on a row the batch calls real, still gave
a map; a pair model fed pairs without ``token_type_ids`` silently explained another function (τ(attention, gradient)
0.417 → −0.355 in the issue); a RoBERTa with ``max_position_embeddings=66`` fed 65 pieces failed with a bare
``index 66 is out of bounds`` (its position ids start at ``padding_idx + 1 = 2``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.attribution import attribute

pytest.importorskip("transformers")
from tests.adapters.conftest import tiny_batch, tiny_bert  # noqa: E402

PAIR = torch.tensor([[2, 11, 25, 3, 37, 48, 3], [2, 17, 9, 3, 21, 3, 0]])  # [CLS] a [SEP] b [SEP] (pad)


def _pair_batch(types: bool):
    batch = {"input_ids": PAIR, "attention_mask": (PAIR != 0).long(), "mask": (PAIR != 0) & (PAIR != 2) & (PAIR != 3)}
    if types:
        second = torch.cumsum((PAIR == 3).long(), 1) - (PAIR == 3).long()  # 1 after the first [SEP], closing one too
        batch["token_type_ids"] = (second > 0).long() * (PAIR != 0).long()
    return batch


def test_a_pair_without_token_type_ids_warns_once_naming_them():
    adapter = HuggingFaceAdapter(tiny_bert())
    with torch.no_grad():
        typed = adapter(_pair_batch(types=True)).logits
        with pytest.warns(UserWarning, match=r"no 'token_type_ids' but the model has 2 token types .* rows \[0, 1\]"):
            untyped = adapter(_pair_batch(types=False)).logits
        assert not torch.allclose(typed, untyped)  # what the warning is about: another function
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            adapter(_pair_batch(types=False))  # once per adapter
            attribute(adapter, _pair_batch(types=False), "gradient")


def test_single_sentences_and_typed_pairs_do_not_warn():
    adapter = HuggingFaceAdapter(tiny_bert())
    single = {k: v for k, v in tiny_batch().items() if k != "token_type_ids"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            adapter(single)
            adapter(_pair_batch(types=True))


@pytest.mark.parametrize("width", [5, 7])
def test_an_attention_mask_of_another_width_is_refused(width):
    adapter, batch = HuggingFaceAdapter(tiny_bert()), tiny_batch()
    batch["attention_mask"] = torch.ones(2, width, dtype=torch.long)
    with pytest.raises(
        ValueError, match=r"attention_mask'\] has shape \(2, %d\) but batch\['input_ids'\] has \(2, 6\)" % width
    ):
        attribute(adapter, batch, "gradient")


def test_a_real_token_the_model_does_not_read_is_refused():
    adapter, batch = HuggingFaceAdapter(tiny_bert()), tiny_batch()
    batch["attention_mask"] = batch["attention_mask"].clone()
    batch["attention_mask"][1] = 0  # the batch's mask still calls row 1's words real
    with pytest.raises(ValueError, match=r"attention_mask'\] is all 0 on rows \[1\]"):
        attribute(adapter, batch, "gradient")
    batch = tiny_batch()
    batch["attention_mask"] = batch["attention_mask"].clone()
    batch["attention_mask"][0, 2] = 0
    with pytest.raises(ValueError, match=r"calls position 2 of row 0 a real token but batch\['attention_mask'\] is 0"):
        attribute(adapter, batch, "gradient")


def _roberta(positions: int = 66):
    from transformers import RobertaConfig, RobertaForSequenceClassification

    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=positions,
        pad_token_id=1,
        attn_implementation="eager",
    )
    return HuggingFaceAdapter(RobertaForSequenceClassification(config).eval())


def _pieces(n: int):
    ids = torch.randint(4, 40, (1, n))
    ids[0, 0], ids[0, -1] = 0, 2  # <s> ... </s>
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_roberta_position_limit_counts_the_padding_offset():
    adapter = _roberta()
    assert adapter.max_length == 64
    with torch.no_grad():
        assert adapter(_pieces(64)).logits.shape == (1, 2)  # at its exact limit
        with pytest.raises(
            ValueError,
            match=r"65 word-pieces exceed the model's max length 64 .*padding_idx.*"
            r"truncation=True, max_length=64",
        ):
            adapter(_pieces(65))
