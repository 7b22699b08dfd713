"""AlignmentAudit (issue #31): the alignment error rate of the links a generator's maps induce, against the gold links
of the bundled Greek→English corpus, checked against a hand computation from the model's own ``output_attentions``
(argmax per target word, corpus-level counts)."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AlignmentAudit


def hand_aer(word_maps, batch):
    """Corpus AER / precision / recall of target-argmax links, by hand: ``word_maps[b]`` is ``[K, S_words]`` (target
    step × source word) for row ``b``, target word ``t`` is step ``t`` (the end-of-sequence step is never a word), and
    excluded target words get no link."""
    predicted = sure = both = 0
    for b, verse_links in enumerate(batch["alignment"]):
        links = {
            (int(word_maps[b][t].argmax()), t) for t, excluded in enumerate(batch["target_exclude"][b]) if not excluded
        }
        gold = set(map(tuple, verse_links))
        predicted, sure, both = predicted + len(links), sure + len(gold), both + len(links & gold)
    return 1 - 2 * both / (predicted + sure), both / predicted, both / sure


def source_columns(maps, batch):
    """Each row's ``[K, T]`` map restricted to its source positions (one word each), in order."""
    return [m[:, batch["source_words"][b] >= 0] for b, m in enumerate(maps)]


def own_step_attention(model, batch, causal: bool, layer: int):
    """``[B, K, T]``: each target step's row of the model's own attention maps (mean of heads), by hand."""
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
            output_attentions=True,
        )
    maps = []
    for b in range(batch["input_ids"].shape[0]):
        positions = (batch["labels"][b] != -100).nonzero().flatten()
        if causal:  # the logits at s - 1 predict the token at s: that query row reads the prompt
            rows = out.attentions[layer][b].mean(0)[positions - 1]
        else:
            rows = out.cross_attentions[layer][b].mean(0)[positions]
        maps.append(rows)
    return maps


@pytest.mark.parametrize("kind", ["bart", "llama"])
def test_alignment_audit_matches_a_hand_computation(gen_kit, tmp_path, kind):
    causal = kind == "llama"
    Generation, Verses = gen_kit.classes()
    dm = Verses(causal=causal)
    pl.seed_everything(0, verbose=False)
    module = Generation(kind, dm.word_ids)
    # budget=None: on a loaded machine the cost budget may thin the cadence, and the last audit would not be of the
    # final model this test recomputes by hand
    audit = AlignmentAudit(methods=("gradient",), budget=None)
    trainer = gen_kit.make_trainer(tmp_path, [audit], max_epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    metrics = audit.history[-1]["metrics"]
    assert metrics["sentences"] == 6
    assert {"attention", "attention_layer_0", "attention_layer_1", "gradient"} == {
        k.split("/")[0] for k in metrics if "/" in k
    }
    rows = [dm.val_dataloader().dataset[i] for i in audit.audit_indices(trainer, "val")]
    batch = dm.val_dataloader().collate_fn(rows)
    module.model.eval()
    for layer in (0, 1):
        aer, precision, recall = hand_aer(
            source_columns(own_step_attention(module.model, batch, causal, layer), batch), batch
        )
        assert metrics[f"attention_layer_{layer}/aer"] == pytest.approx(aer, abs=1e-12)
        assert metrics[f"attention_layer_{layer}/precision"] == pytest.approx(precision, abs=1e-12)
        assert metrics[f"attention_layer_{layer}/recall"] == pytest.approx(recall, abs=1e-12)
    assert metrics["attention/aer"] == metrics["attention_layer_1/aer"]  # the default reduction: last layer, mean
    gradient = attribute(audit.explainable(module), batch, "gradient", target="steps")
    aer, _, _ = hand_aer(source_columns(gradient, batch), batch)
    assert metrics["gradient/aer"] == pytest.approx(aer, abs=1e-12)
    assert 0.0 < metrics["gradient/aer"] < 1.0


def test_pieces_pool_to_words_and_gold_matrices_count_as_pairs(gen_kit):
    """Source word 0 of each row split into two pieces: its score is the sum of theirs; row 1's gold is a matrix."""
    verses = gen_kit.aligned_verses("val", 2)
    vocab = gen_kit.word_vocab(verses)
    model = gen_kit.generator("bart", len(vocab) + 3).double().eval()
    rows = []
    for verse in verses:
        row = gen_kit.generation_row(verse, vocab, causal=False)
        row["input_ids"] = torch.cat([row["input_ids"][:1], row["input_ids"]])  # word 0 as two pieces
        row["source_words"] = torch.cat([row["source_words"][:1], row["source_words"]])
        rows.append(row)
    batch = gen_kit.collate(rows)
    gold_matrix = torch.zeros(len(verses[1].source), len(verses[1].target), dtype=torch.bool)
    for s, t in verses[1].sure:
        gold_matrix[s, t] = True
    batch["alignment"] = [batch["alignment"][0], gold_matrix]
    audit = AlignmentAudit(methods=(), layers=False)
    audit._device = "cpu"
    audit.audit_batch(HuggingFaceAdapter(model), batch, torch.Generator(), [0, 1])
    found = audit.aggregate([], {})
    own = source_columns(own_step_attention(model, batch, False, -1), batch)
    words = [torch.cat([m[:, :2].sum(1, keepdim=True), m[:, 2:]], 1) for m in own]  # pieces 0 and 1: word 0
    aer, precision, recall = hand_aer(words, dict(batch, alignment=[v.sure for v in verses]))
    assert found["attention/aer"] == pytest.approx(aer, abs=1e-12)
    assert found["attention/precision"] == pytest.approx(precision, abs=1e-12)
    assert found["attention/recall"] == pytest.approx(recall, abs=1e-12)
    assert found["sentences"] == 2


def test_gold_links_outside_the_words_are_an_error_naming_the_row(gen_kit):
    verses = gen_kit.aligned_verses("val", 1)
    vocab = gen_kit.word_vocab(verses)
    batch = gen_kit.collate([gen_kit.generation_row(verses[0], vocab, causal=False)])
    batch["alignment"] = [[(len(verses[0].source), 0)]]
    audit = AlignmentAudit(methods=(), layers=False)
    model = HuggingFaceAdapter(gen_kit.generator("bart", len(vocab) + 3).eval())
    with pytest.raises(ValueError, match="row 0.*outside its"):
        audit.audit_batch(model, batch, torch.Generator(), [0])


def test_setup_refuses_a_classifier_a_class_logit_method_and_batches_without_links(gen_kit, kit, tmp_path):
    dm = kit.make_dm(train=32, val=8)
    with pytest.raises(MisconfigurationException, match="AlignmentAudit scores the word alignments"):
        kit.make_trainer(tmp_path, [AlignmentAudit()]).fit(kit.make_model(dm), datamodule=dm)
    Generation, Verses = gen_kit.classes()
    verses = Verses(causal=False)
    with pytest.raises(MisconfigurationException, match=r"with \['lrp'\]"):
        gen_kit.make_trainer(tmp_path, [AlignmentAudit(methods=("lrp",))]).fit(
            Generation("bart", verses.word_ids), datamodule=verses
        )
    with pytest.raises(MisconfigurationException, match="no 'gold' key"):
        gen_kit.make_trainer(tmp_path, [AlignmentAudit(alignment_key="gold")]).fit(
            Generation("bart", verses.word_ids), datamodule=verses
        )
    with pytest.raises(MisconfigurationException, match="rule='argmax'"):
        AlignmentAudit(rule="argmax")
    with pytest.raises(MisconfigurationException, match="threshold= goes with"):
        AlignmentAudit(threshold=0.5)
