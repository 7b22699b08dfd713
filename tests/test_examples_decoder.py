"""The decoder examples' data and evaluation pieces (examples/llama_sst2.py, examples/llama_pronoun_deception.py)."""

import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def examples_path():
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


def test_decoder_batches_carry_the_attention_mask(examples_path):
    from llama_sst2 import DecoderSST2

    dm = DecoderSST2("sst2", batch_size=4)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert torch.equal(batch["attention_mask"], batch["mask"].long())


def test_pronoun_mass_reads_the_last_real_token_row(examples_path):
    from hf_pronoun_deception import dev_attention_mass
    from llama_pronoun_deception import DecoderPronoun, tiny_llama

    from lightning_xai.models import HFClassifier

    dm = DecoderPronoun(train_limit=50, batch_size=8)
    dm.setup("fit")
    assert len(dm.examples("train")) == 50
    module = HFClassifier(model=tiny_llama(dm.vocab_size, 16, 1, 0, 160)).eval()
    result = dev_attention_mass(module, dm, dev_limit=8)
    batch = dm.collator([dm.dataset("val")[i] for i in range(8)])
    with torch.no_grad():
        raw = module(batch).raw_attentions[-1]
    last = batch["mask"].sum(-1) - 1  # right padding: the last real token
    rows = raw[torch.arange(8), :, last]  # [B, heads, T]
    expected = (rows * batch["impermissible"].unsqueeze(1)).sum(-1)
    assert result["mass_raw_mean_heads"] == pytest.approx(float(expected.mean()), abs=1e-6)
    assert result["mass_raw_max_head"] == pytest.approx(float(expected.amax(1).mean()), abs=1e-6)
    assert float(raw[torch.arange(8), :, 0].mul(batch["impermissible"].unsqueeze(1)).sum(-1).mean()) != pytest.approx(
        result["mass_raw_mean_heads"], abs=1e-6
    )  # row 0 (the old reading) differs
    assert torch.equal(
        batch["word_ids"][batch["mask"]], torch.arange(batch["mask"].shape[1]).expand(8, -1)[batch["mask"]]
    )
