"""examples/causal_lm_sst2.py: the label-word prompts, the accuracy rule, and a tiny run of both audited models."""

import math
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLES))
    import causal_lm_sst2

    yield causal_lm_sst2
    sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def prompts(example):
    dm = example.PromptSST2({"train": 8, "val": 6}, batch_size=3, seed=0)
    dm.setup("fit")
    return dm


def test_prompts_explain_the_label_word_from_the_review_words(example, prompts):
    from lightning_xai.adapters import explainable_model

    reviews = example.ReviewSST2({"train": 8, "val": 6}, batch_size=3, seed=0)
    reviews.setup("fit")
    assert reviews.vocab.itos == prompts.vocab.itos  # the classifier's word vocabulary, unchanged
    batch = next(iter(prompts.val_dataloader()))
    plain = next(iter(reviews.val_dataloader()))
    itos = prompts.vocab.itos
    for row in range(3):
        n = int(plain["mask"][row].sum())
        words = plain["input_ids"][row, :n].tolist()
        label = "positive" if int(plain["labels"][row]) == 1 else "negative"
        length = int(batch["attention_mask"][row].sum())
        ids = batch["input_ids"][row, :length].tolist()
        assert [itos[i] for i in ids] == ["<sos>", *[itos[w] for w in words], "sentiment", ":", label]
        target = (batch["labels"][row] != -100).nonzero().flatten().tolist()
        assert target == [length - 1] and int(batch["labels"][row, length - 1]) == ids[-1]
        assert batch["mask"][row].nonzero().flatten().tolist() == list(range(1, n + 1))
    # the generation adapter's source: the review words only (not <sos>, not the cue, not the label word)
    lm = example.tiny_causal_llama(prompts.vocab_size, 16, 1, 0, prompts.bos)
    model = explainable_model(lm)
    assert torch.equal(model.token_mask(batch), batch["mask"])
    with torch.no_grad():
        attention = model(batch).attention
    assert float(attention[~batch["mask"]].abs().max()) == 0.0
    torch.testing.assert_close(attention.sum(1), torch.ones(3))


def test_accuracy_compares_the_label_words_log_probabilities(example, prompts):
    batch = next(iter(prompts.val_dataloader()))
    lm = example.tiny_causal_llama(prompts.vocab_size, 16, 1, 0, prompts.bos).eval()
    with torch.no_grad():
        logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    predicted, gold = example.label_word_choice(logits, batch["labels"], prompts.label_ids)
    negative, positive = prompts.label_ids
    for row in range(3):
        where = int((batch["labels"][row] != -100).nonzero())
        log_probs = logits[row, where - 1].log_softmax(-1)  # transformers' shift: position s − 1 scores token s
        assert int(predicted[row]) == int(log_probs[positive] > log_probs[negative])
        assert int(gold[row]) == int(batch["labels"][row, where] == positive)
    with pytest.raises(ValueError, match="exactly one target"):
        example.label_word_choice(logits, torch.full_like(batch["labels"], -100), prompts.label_ids)


@pytest.mark.slow
def test_tiny_run_audits_both_models_every_epoch(example, tmp_path):
    out = example.run(
        epochs=2,
        hidden=16,
        layers=1,
        audit_samples=8,
        train_size=48,
        val_size=16,
        root=str(tmp_path),
        log=lambda _: None,
    )
    for kind in ("causal_lm", "classifier"):
        result = out[kind]
        assert result["train_examples"] == 48 and result["val_examples"] == 16
        assert len(result["val_acc"]) == 2 and all(0.0 <= a <= 1.0 for a in result["val_acc"])
        attention, erasure = result["attention_audit"], result["erasure_audit"]
        assert [r["epoch"] for r in attention] == [0, 1] == [r["epoch"] for r in erasure]
        assert all(r["num_examples"] == 8 for r in attention + erasure)
        for pair in ("attention_vs_gradient", "attention_vs_grad_x_input"):
            assert math.isfinite(attention[-1]["metrics"][f"kendall_tau/{pair}/mean"]), (kind, pair)
        for ranking in ("attention", "attention_gradient", "random"):
            for value in ("comprehensiveness", "sufficiency", "flipped"):
                assert math.isfinite(erasure[-1]["metrics"][f"{ranking}/{value}/mean"]), (kind, ranking, value)
            assert f"{ranking}/fraction_removed/mean" in erasure[-1]["metrics"]
    assert out["causal_lm"]["erasure_audit"][0]["explained_quantity"] == "log-probability of the target sequence"
    assert out["classifier"]["erasure_audit"][0]["explained_quantity"] == "softmax probability of the target class"
    lines = example.table(out).splitlines()
    assert lines[0].startswith("| | LM ep 1 | head ep 1 | LM ep 2 | head ep 2")
    assert len(lines) == 3 + len(example.ROWS) and "n/a" not in lines[2]
