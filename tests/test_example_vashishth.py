"""examples/vashishth_attention_dependence.py, its pair task (examples/bible_pairs.py): the pairs against the bundled
verses, and the pair row of the audit table against a hand computation of uniform attention."""

import argparse
import sys
from pathlib import Path

import pytest
import torch

from lightning_xai.data import read_alignments

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def modules():
    sys.path.insert(0, str(EXAMPLES))
    import bible_pairs
    import vashishth_attention_dependence

    yield bible_pairs, vashishth_attention_dependence
    sys.path.remove(str(EXAMPLES))


def test_pairs_are_the_verses_translations_and_length_matched_others(modules):
    bible_pairs, _ = modules
    verses = read_alignments("test")
    pairs = bible_pairs.length_matched_pairs(verses, seed=0)
    assert len(pairs) == 2 * len(verses)
    text = [tuple(w.lower() for w in v.target) for v in verses]
    for i, v in enumerate(verses):
        positive, negative = pairs[2 * i], pairs[2 * i + 1]
        assert (positive.greek, positive.english, positive.label) == (i, i, 1)
        assert negative.greek == i and negative.label == 0
        assert text[negative.english] != text[i]  # never the verse's own English (nor a verbatim copy of it)
        closest = min(abs(len(verses[j].target) - len(v.target)) for j in range(len(verses)) if text[j] != text[i])
        assert abs(len(verses[negative.english].target) - len(v.target)) == closest
    same_length = sum(len(verses[p.english].target) == len(verses[p.greek].target) for p in pairs[1::2])
    assert same_length / len(verses) > 0.95  # Mark has a same-length other verse for nearly every verse
    assert bible_pairs.length_matched_pairs(verses, seed=0) == pairs
    assert bible_pairs.length_matched_pairs(verses, seed=1) != pairs


def test_encoded_pairs_read_the_greek_and_english_of_their_verses(modules):
    bible_pairs, _ = modules
    verses = read_alignments("val")
    vocab = bible_pairs.PairVocab([v.source for v in verses] + [v.target for v in verses])
    batch = next(iter(bible_pairs.pair_loader(verses[:3], vocab, seed=0, batch_size=6)))
    pairs = bible_pairs.length_matched_pairs(verses[:3], seed=0)
    for row, pair in enumerate(pairs):
        english = [vocab.words[i] for i in batch["input_ids"][row][batch["mask"][row]].tolist()]
        greek = [vocab.words[i] for i in batch["greek_ids"][row][batch["greek_mask"][row]].tolist()]
        assert english == [w.lower() for w in verses[pair.english].target]
        assert greek == [w.lower() for w in verses[pair.greek].source]
        assert batch["labels"][row].item() == pair.label


def _hand_uniform(model, batch):
    """Probabilities with the trained attention and with the English states averaged, computed without overrides."""
    english = model.english_encoder(model.embedding(batch["input_ids"]), batch["mask"])
    greek = model.greek_encoder(model.embedding(batch["greek_ids"]), batch["greek_mask"])
    gm, em = batch["greek_mask"].unsqueeze(-1).float(), batch["mask"].unsqueeze(-1).float()
    query = (greek * gm).sum(1) / gm.sum(1)
    scores = model.score(torch.tanh(model.key(english) + model.query(query).unsqueeze(1))).squeeze(-1)
    alpha = scores.masked_fill(~batch["mask"], float("-inf")).softmax(-1)

    def probs(context):
        features = torch.cat([context, query, context * query, (context - query).abs()], -1)
        return model.classifier(features).softmax(-1)

    trained = probs(torch.einsum("bt,bth->bh", alpha, english))
    uniform = probs((english * em).sum(1) / em.sum(1))
    return trained, uniform


def test_pair_row_equals_a_hand_computation(modules):
    bible_pairs, script = modules
    train, test = read_alignments("train"), read_alignments("test")
    settings = bible_pairs.PairSettings(embedding_dim=16, hidden_dim=8, epochs=1, train_verses=300)
    model, vocab, cached = bible_pairs.train_or_load(settings, train, test[:20], cache=None, log=lambda _: None)
    assert not cached and not model.training
    args = argparse.Namespace(pair_verses=12, permutations=5, seed=0)
    row = script.pair_audit(model, vocab, args, "tiny")
    batch = next(iter(bible_pairs.pair_loader(test[:12], vocab, seed=0, batch_size=24)))
    with torch.no_grad():
        trained, uniform = _hand_uniform(model, batch)
        torch.testing.assert_close(trained, model(batch).logits.softmax(-1))  # the hand model is the model
    labels = batch["labels"]
    assert row["examples"] == "24 pairs"
    assert row["accuracy_trained"] == pytest.approx((trained.argmax(-1) == labels).double().mean().item())
    assert row["accuracy_uniform"] == pytest.approx((uniform.argmax(-1) == labels).double().mean().item())
    flips = (trained.argmax(-1) != uniform.argmax(-1)).double().mean().item()
    assert row["uniform_changed"] == pytest.approx(flips)
    tv = 0.5 * (trained - uniform).abs().sum(-1)
    assert tv.mean().item() > 1e-4  # the hand computation sees a difference for the row to match
    assert row["uniform_tv"] == pytest.approx(tv.mean().item(), rel=1e-4)
    assert 0 < row["permutation_tv_median"] < 1
