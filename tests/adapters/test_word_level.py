"""Word <-> word-piece views on real bundled data with the MiniLM tokenizer (tokenizer only: fast)."""

from __future__ import annotations

import pytest
import torch

from lightning_xai.adapters import pieces_to_words, to_word_level, words_to_pieces
from lightning_xai.data import read_split
from lightning_xai.data.hf import HFTextClassificationDataModule, WordDataset, WordPieceCollator

PRONOUNS = {"he", "she", "her", "his", "him", "himself", "herself"}


def _items(dataset, n, split="val"):
    data = WordDataset(read_split(dataset, split)[:n])
    return [data[i] for i in range(len(data))]


def test_pronoun_masks_land_on_the_pronoun_pieces(tokenizer):
    items = _items("pronoun", 24)
    batch = WordPieceCollator(tokenizer)(items)
    pieces = [tokenizer.convert_ids_to_tokens(row) for row in batch["input_ids"]]
    for row, item in enumerate(items):
        marked = {pieces[row][t] for t in batch["impermissible"][row].nonzero().flatten().tolist()}
        assert marked and marked <= PRONOUNS
        # every piece of every impermissible word is impermissible, and nothing else is
        for t, w in enumerate(batch["word_ids"][row].tolist()):
            expected = w >= 0 and bool(item["impermissible"][w])
            assert bool(batch["impermissible"][row, t]) == expected
    assert torch.equal(
        batch["word_impermissible"][:, :5],
        torch.tensor([[bool(v) for v in (it["impermissible"] + [0] * 5)[:5]] for it in items]),
    )


def test_pieces_reassemble_the_words(tokenizer):
    items = _items("sst2", 16)
    batch = WordPieceCollator(tokenizer)(items)
    for row, item in enumerate(items):
        ids = batch["input_ids"][row]
        word_ids = batch["word_ids"][row]
        for w, word in enumerate(item["tokens"]):
            piece_ids = ids[word_ids == w].tolist()
            assert tokenizer.decode(piece_ids).replace(" ", "") == tokenizer.decode(
                tokenizer(word, add_special_tokens=False)["input_ids"]
            ).replace(" ", "")
    special = (batch["input_ids"] == tokenizer.cls_token_id) | (batch["input_ids"] == tokenizer.sep_token_id)
    assert torch.all(batch["word_ids"][special] == -1) and not batch["mask"][special].any()
    assert torch.equal(batch["mask"], batch["word_ids"] >= 0)
    assert torch.equal(batch["word_mask"].sum(-1), torch.tensor([len(i["tokens"]) for i in items]))


def test_sum_aggregation_preserves_totals_and_inverts_spreading(tokenizer):
    batch = WordPieceCollator(tokenizer)(_items("sst2", 8))
    torch.manual_seed(0)
    scores = torch.rand(batch["input_ids"].shape) * batch["mask"]
    words = to_word_level(scores, batch)
    torch.testing.assert_close(words.sum(-1), scores.sum(-1))
    # a word's score is the sum of its pieces: dividing the word value evenly among pieces round-trips
    counts = pieces_to_words(batch["mask"].float(), batch["word_ids"], batch["word_mask"].shape[1])
    spread = words_to_pieces(words / counts.clamp_min(1), batch["word_ids"])
    torch.testing.assert_close(to_word_level(spread, batch), words)
    assert torch.all(words[~batch["word_mask"]] == 0)


def test_hand_example_and_errors():
    word_ids = torch.tensor([[-1, 0, 1, 1, 2, -1, -1]])
    scores = torch.tensor([[9.0, 1.0, 2.0, 3.0, 4.0, 9.0, 9.0]])
    assert pieces_to_words(scores, word_ids).tolist() == [[1.0, 5.0, 4.0]]
    assert words_to_pieces(torch.tensor([[1, 2, 3]]), word_ids).tolist() == [[0, 1, 2, 2, 3, 0, 0]]
    with pytest.raises(ValueError, match="refer to word 2 but word_values has only 2"):
        words_to_pieces(torch.tensor([[1, 2]]), word_ids)
    with pytest.raises(TypeError, match="integer tensor"):
        pieces_to_words(scores, word_ids.float())
    with pytest.raises(KeyError, match="word_ids"):
        to_word_level(scores, {"mask": torch.ones(1, 7, dtype=torch.bool)})


def test_truncation_warns_with_the_rationale_words_cut_off(tokenizer):
    words = ["good"] * 6 + ["unbelievably", "great"]
    item = {"tokens": words, "labels": 1, "index": 0, "rationale": [0] * 6 + [1, 1]}
    collate = WordPieceCollator(tokenizer, max_length=9)  # [CLS] + 7 pieces + [SEP]: "great" and part of
    with pytest.warns(
        UserWarning,
        match=r"truncated 1 of 1 texts to max_length=9 word-pieces; 2 words were cut "
        r"off \(fully or partly\), including 2 rationale",
    ):
        batch = collate([item])
    assert batch["input_ids"].shape[1] == 9
    assert batch["rationale"].sum() == 1  # the surviving piece of "unbelievably"
    assert batch["word_mask"][0].tolist() == [True] * 7 + [False]


def test_long_eraser_documents_warn_once_per_split(tokenizer):
    dm = HFTextClassificationDataModule(tokenizer, "eraser_movies", batch_size=2, max_length=128)
    assert dm.word_module.hparams.max_length is None  # the word-piece limit must not truncate the words
    dm.word_module._examples["val"] = dm.word_module.examples("val")[:4]
    with pytest.warns(UserWarning, match=r"val: truncated 4 of 4 texts to max_length=128.*rationale"):
        dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape[1] == 128 and batch["rationale"].dtype == torch.bool


def test_collator_refuses_slow_tokenizers_and_bad_masks(tokenizer):
    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match="not a fast tokenizer"):
        WordPieceCollator(Slow())
    with pytest.raises(ValueError, match="'rationale' has 2 values for 3 words"):
        WordPieceCollator(tokenizer)([{"tokens": ["a", "b", "c"], "labels": 0, "rationale": [0, 1]}])


def test_data_module_batches_for_the_adapter(tokenizer):
    dm = HFTextClassificationDataModule(tokenizer, "sst2", batch_size=4, train_limit=8)
    dm.setup("fit")
    assert len(dm.examples("train")) == 8 and dm.num_classes == 2
    batch = next(iter(dm.train_dataloader()))
    assert {"input_ids", "attention_mask", "token_type_ids", "mask", "labels", "index", "word_ids", "word_mask"} <= set(
        batch
    )
    words = dm.tokens("train", int(batch["index"][0]))
    assert batch["word_mask"][0].sum() == len(words)
    with pytest.raises(ValueError, match="'add_sos_eos' is not a word-level option"):
        HFTextClassificationDataModule(tokenizer, "sst2", add_sos_eos=True)
    assert dm.word_module.hparams.max_length is None
