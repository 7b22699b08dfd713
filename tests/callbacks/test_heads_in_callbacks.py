"""Issue 30 item 3 in the callbacks: a regression head and a multi-label head in an unmodified LightningModule.

The audit callbacks read a model's head (``head_kind_of``) instead of applying softmax/argmax to every output: an
example's ``probability`` is the regression output value (``prediction`` -1: no class) or the sigmoid of the predicted
label, the explained quantity is recorded, and the audits that need a decision or a softmax distribution refuse a
regression head at setup, by name, instead of failing (or measuring nothing) at the first audit.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.callbacks import AdversarialSearchAudit, AttentionAudit, AttentionBaselines, ErasureAudit
from lightning_xai.data import read_split

transformers = pytest.importorskip("transformers")
from tests.callbacks.test_user_module import sst2_tokenizer  # noqa: E402


class HeadModule(pl.LightningModule):
    """A user's module: a tiny BERT with a regression (``num_labels=1``) or a multi-label head, nothing else."""

    def __init__(self, tokenizer, head: str) -> None:
        super().__init__()
        self.tokenizer = tokenizer  # gives the audits the special tokens, as a user's module often holds it
        labels = {
            "regression": dict(num_labels=1),
            "multi_label": dict(num_labels=3, problem_type="multi_label_classification"),
        }[head]
        config = transformers.BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
            attn_implementation="eager",
            **labels,
        )
        self.model = transformers.BertForSequenceClassification(config)

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _loaders(tokenizer, head: str):
    collate = transformers.DataCollatorWithPadding(tokenizer)

    def rows(split: str, n: int):
        out = []
        for e in read_split("sst2", split)[:n]:
            label = float(e.label) if head == "regression" else [float(e.label), 1.0 - e.label, 0.0]
            out.append(dict(tokenizer(" ".join(e.tokens), truncation=True, max_length=32), labels=label))
        return torch.utils.data.DataLoader(out, batch_size=8, collate_fn=collate)

    return rows("train", 16), rows("val", 8)


def _fit(tmp_path, head: str, callbacks):
    tokenizer = sst2_tokenizer(tmp_path)
    pl.seed_everything(0, verbose=False)
    module = HeadModule(tokenizer, head)
    train, val = _loaders(tokenizer, head)
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        callbacks=list(callbacks),
    )
    trainer.fit(module, train, val)
    return trainer, module, val


def _hand_gradient(module, audit, batch, score):
    """‖∂ score(logits)/∂ word embedding‖₂ over the real tokens, by hand through the user's model."""
    model = module.model.eval()
    emb = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    logits = model(
        inputs_embeds=emb, attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
    ).logits
    (grad,) = torch.autograd.grad(score(logits).sum(), emb)
    mask = audit.explainable(module).token_mask(batch)
    return grad.norm(dim=-1), logits.detach(), mask


@pytest.mark.parametrize("head", ["regression", "multi_label"])
def test_attention_audit_explains_what_the_head_computes(head, tmp_path):
    audit = AttentionAudit(methods=("gradient",), num_samples=None, budget=None)
    trainer, module, val = _fit(tmp_path, head, [audit])
    assert [r["epoch"] for r in audit.history] == [0]
    expected = {"regression": "regression output value", "multi_label": "sigmoid probability of the target label"}
    assert audit.latest.explained_quantity == expected[head] == audit.history[-1]["explained_quantity"]

    batch = next(iter(val))
    batch = {k: v for k, v in batch.items() if k != "labels"}
    if head == "regression":
        score = lambda logits: logits[:, 0]  # noqa: E731 - the output value itself
    else:
        score = lambda logits: logits.sigmoid().gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)  # noqa: E731
    grads, logits, mask = _hand_gradient(module, audit, batch, score)
    examples = {e.index: e for e in audit.latest.examples}
    assert sorted(examples) == list(range(8))
    for row in range(8):
        example = examples[row]
        hand = grads[row][mask[row]]
        assert torch.allclose(torch.tensor(example.maps["gradient"]), hand.float(), atol=1e-5, rtol=1e-4)
        assert float(hand.abs().sum()) > 0
        if head == "regression":  # no class: prediction -1, probability the output value (not softmax([v]) = 1)
            assert example.prediction == -1
            assert example.probability == pytest.approx(float(logits[row, 0]), abs=1e-5)
        else:  # the highest-scoring label and its sigmoid (not a softmax over the labels)
            assert example.prediction == int(logits[row].argmax())
            assert example.probability == pytest.approx(float(logits[row].max().sigmoid()), abs=1e-5)


def test_erasure_audit_refuses_decision_flips_of_a_regression_head_at_setup(tmp_path):
    audit = ErasureAudit(num_samples=None, budget=None)  # decision_flip=True by default
    with pytest.raises(MisconfigurationException, match="regression.*decision_flip=False"):
        _fit(tmp_path, "regression", [audit])
    assert audit.history == []


def test_erasure_audit_measures_the_change_of_a_regression_value(tmp_path):
    audit = ErasureAudit(decision_flip=False, num_samples=None, budget=None)  # attention, ∂value/∂α, random
    _fit(tmp_path, "regression", [audit])
    metrics = audit.history[-1]["metrics"]
    assert audit.history[-1]["explained_quantity"] == "regression output value"
    for ranking in ("attention", "attention_gradient", "random"):
        assert torch.isfinite(torch.tensor(metrics[f"{ranking}/comprehensiveness/mean"]))
        assert f"{ranking}/flipped/mean" not in metrics
    # comprehensiveness is a change of the value, not of softmax([v]) = 1 (which is always 0)
    assert any(abs(e.values["attention/comprehensiveness"]) > 0 for e in audit.latest.examples)


@pytest.mark.parametrize(
    "callback",
    [
        AttentionBaselines(num_permutations=2, num_samples=None, budget=None),
        AdversarialSearchAudit(steps=2, num_samples=None, budget=None),
    ],
    ids=lambda c: type(c).__name__,
)
def test_softmax_only_audits_refuse_a_regression_head_at_setup(callback, tmp_path):
    with pytest.raises(MisconfigurationException, match=f"{type(callback).__name__}.*regression head"):
        _fit(tmp_path, "regression", [callback])
    assert callback.history == []
