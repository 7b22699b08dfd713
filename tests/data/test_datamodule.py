"""The bundled datasets load with the documented counts, masks stay aligned, and bad input fails clearly."""

from __future__ import annotations

import json

import pytest
import pytorch_lightning as pl
import torch

from lightning_xai.data import TextClassificationDataModule, Vocabulary, read_split, read_user_file
from lightning_xai.data.readers import Example, jain_wallace_clean
from lightning_xai.models import AttentionClassifier

COUNTS = {  # from each dataset's README (source notes shipped next to the data)
    "sst2": {"train": 6920, "val": 872, "test": 1821},
    "sst_wiki": {"train": 6920, "val": 872, "test": 1821},
    "pronoun": {"train": 9017, "val": 1127, "test": 1127},
    "occupation": {"val": 2519, "test": 5037},
    "eraser_movies": {"train": 1600, "val": 200, "test": 199},
}
PRONOUNS = {"he", "she", "her", "his", "him", "himself", "herself"}


@pytest.mark.parametrize("dataset", sorted(COUNTS))
def test_bundled_counts(dataset):
    for split, count in COUNTS[dataset].items():
        assert len(read_split(dataset, split)) == count


def test_pronoun_masks_mark_exactly_the_pronouns():
    for example in read_split("pronoun", "val")[:300]:
        assert example.impermissible == [int(t in PRONOUNS) for t in example.tokens]


def test_sst_wiki_mask_is_one_run_of_ones_then_zeros():
    for example in read_split("sst_wiki", "val")[:200]:
        mask = example.impermissible
        first_zero = mask.index(0) if 0 in mask else len(mask)
        assert all(mask[:first_zero]) and not any(mask[first_zero:])


def test_eraser_rationales_align_with_tokens():
    import gzip

    from lightning_xai.data.readers import bundled_path

    examples = read_split("eraser_movies", "val")
    with gzip.open(bundled_path("eraser_movies", "val.jsonl"), "rt") as handle:
        annotations = [json.loads(line) for line in handle]
    for example, annotation in zip(examples[:20], annotations[:20]):
        for group in annotation["evidences"]:
            for span in group:
                assert example.tokens[span["start_token"] : span["end_token"]] == span["text"].lower().split()
                assert all(example.rationale[span["start_token"] : span["end_token"]])


def test_batches_carry_masks_aligned_with_tokens():
    dm = TextClassificationDataModule("pronoun", batch_size=8)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"input_ids", "mask", "labels", "index", "impermissible"}
    assert batch["impermissible"].shape == batch["input_ids"].shape
    assert not (batch["impermissible"] & ~batch["mask"]).any()
    for row, index in enumerate(batch["index"].tolist()):
        words = dm.vocab.decode(batch["input_ids"][row][batch["impermissible"][row]].tolist())
        assert set(words) <= PRONOUNS and words
        assert dm.tokens("val", index)[: int(batch["mask"][row].sum())] == dm.examples("val")[index].tokens


def test_sos_eos_are_read_but_masked_out():
    dm = TextClassificationDataModule("sst2", batch_size=4, add_sos_eos=True)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    lengths = batch["input_mask"].sum(1)
    assert torch.equal(batch["mask"].sum(1), lengths - 2)
    assert not batch["mask"][:, 0].any()
    assert (batch["input_ids"][:, 0] == dm.vocab.stoi["<sos>"]).all()


def test_jain_wallace_preprocessing_drops_short_and_punctuation():
    test = TextClassificationDataModule("sst2", jain_wallace_preprocessing=True).examples("test")
    assert all(len(e.tokens) > 5 for e in test)
    assert all(t.isalnum() or "_" in t for e in test for t in e.tokens)
    # Jain & Wallace report 1725 test sentences after this filter; our cleaning keeps one more.
    assert len(test) == 1726
    wiki = TextClassificationDataModule("sst_wiki", jain_wallace_preprocessing=True).examples("test")
    assert all(len(e.impermissible) == len(e.tokens) for e in wiki)


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(ValueError, match="bundled datasets: eraser_movies, occupation, pronoun, sst2, sst_wiki"):
        TextClassificationDataModule("imdb")


def test_occupation_has_no_train_unless_asked():
    with pytest.raises(ValueError, match="use_dev_as_train=True"):
        TextClassificationDataModule("occupation")
    dm = TextClassificationDataModule("occupation", use_dev_as_train=True)
    assert len(dm.examples("train")) == COUNTS["occupation"]["val"]


def test_user_tsv_and_jsonl(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("text\ty\nA good film\t1\nA bad film\t0\n")
    dm = TextClassificationDataModule(train_path=str(tsv), text_column="text", label_column="y", batch_size=2)
    dm.setup("fit")
    assert dm.num_classes == 2 and dm.vocab.encode(["good"]) != [1]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text(json.dumps({"sentence": "he is here", "label": 0, "impermissible": [1, 0, 0]}) + "\n")
    assert read_user_file(str(jsonl))[0].impermissible == [1, 0, 0]


def test_user_file_missing_label_column(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("sentence\tscore\nfine\t1\n")
    with pytest.raises(ValueError, match="no 'label' column .*label_column"):
        TextClassificationDataModule(train_path=str(tsv)).setup("fit")


def test_mask_length_mismatch(tmp_path):
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text(json.dumps({"sentence": "he is here", "label": 0, "rationale": [1, 0]}) + "\n")
    with pytest.raises(ValueError, match="mask has 2 values but the text has 3"):
        read_user_file(str(jsonl))


def test_empty_split(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("sentence\tlabel\n")
    with pytest.raises(ValueError, match="'train' split is empty"):
        TextClassificationDataModule(train_path=str(tsv)).setup("fit")


def test_labels_outside_num_classes(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("sentence\tlabel\nfine film\t0\nbad film\t3\n")
    dm = TextClassificationDataModule(train_path=str(tsv), batch_size=2)
    model = AttentionClassifier(dm.vocab_size, num_classes=2, embedding_dim=4, hidden_dim=2)
    trainer = pl.Trainer(
        fast_dev_run=True,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        trainer.fit(model, dm)


def test_vocabulary_is_saved_with_the_model(tmp_path, sst2):
    model = AttentionClassifier(sst2.vocab_size, 2, embedding_dim=8, hidden_dim=4)
    trainer = pl.Trainer(
        max_steps=2,
        limit_val_batches=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, sst2)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    restored = AttentionClassifier.load_from_checkpoint(path)
    assert restored.vocab == sst2.vocab.itos
    restored_dm = TextClassificationDataModule("sst2")
    restored_dm.load_state_dict(torch.load(path, weights_only=False)["TextClassificationDataModule"])
    assert restored_dm.vocab.itos == sst2.vocab.itos


def test_vocabulary_rejects_bad_layout():
    with pytest.raises(ValueError, match="starts with '<pad>', '<unk>'"):
        Vocabulary(["a", "b"])


def test_clean_keeps_masks_aligned():
    example = jain_wallace_clean(Example(["he", "-lrb-", "is", "n't", "."], 0, impermissible=[1, 0, 0, 1, 0]))
    assert example.tokens == ["he", "is", "n", "t"] and example.impermissible == [1, 0, 1, 1]
