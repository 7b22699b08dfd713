"""Issue 30 item 5: a vocabulary kept as a dict (id -> token or token -> id) names the tokens wherever a vocab is
read — the report's example words, the reference model's copy from the data module, the adversary's check."""

from __future__ import annotations

import types

import pytest

from lightning_xai.callbacks import AuditExample
from lightning_xai.callbacks._audit.results import example_tokens
from lightning_xai.data.vocabulary import token_list

WORDS = ["<pad>", "<unk>", "good", "film"]
FORMS = {
    "list": WORDS,
    "id -> token": dict(enumerate(WORDS)),
    "token -> id": {w: i for i, w in enumerate(WORDS)},
    "json id -> token": {str(i): w for i, w in enumerate(WORDS)},
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_report_names_the_tokens_of_a_dict_vocab_on_the_data_module(form):
    trainer = types.SimpleNamespace(datamodule=types.SimpleNamespace(vocab=FORMS[form]))
    example = AuditExample(0, 0, "val", [2, 3], 1, 1, 0.9)
    assert example_tokens(trainer, object(), example) == ["good", "film"]
    assert token_list(FORMS[form]) == WORDS


def test_an_unreadable_vocab_warns_and_shows_ids():
    trainer = types.SimpleNamespace(datamodule=types.SimpleNamespace(vocab={"<pad>": 0, "film": 3}))
    with pytest.warns(UserWarning, match="missing 1, 2.*the report shows ids"):
        assert example_tokens(trainer, object(), AuditExample(0, 0, "val", [3], 1, 1, 0.9)) == ["3"]
    with pytest.raises(ValueError, match="neither id -> token .* nor token -> id"):
        token_list({1: 2})


def test_the_reference_model_and_the_adversary_read_a_dict_vocab():
    from lightning_xai.losses import ModelConsistentAdversary
    from lightning_xai.models import AttentionClassifier

    model = AttentionClassifier(vocab_size=4, num_classes=2, embedding_dim=4, hidden_dim=2)
    model._trainer = types.SimpleNamespace(datamodule=types.SimpleNamespace(vocab=FORMS["token -> id"]))
    model.setup("fit")
    assert model.vocab == WORDS
    base = AttentionClassifier(vocab_size=4, num_classes=2, embedding_dim=4, hidden_dim=2)
    base.vocab = FORMS["id -> token"]
    ModelConsistentAdversary(base).check_vocabulary(model)  # the same words, kept two ways
    base.vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "film", "good"])}
    with pytest.raises(ValueError, match="different vocabulary lists"):
        ModelConsistentAdversary(base).check_vocabulary(model)
