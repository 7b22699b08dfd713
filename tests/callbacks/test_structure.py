"""The shared machinery after the split of ``callbacks/base.py``: the prediction step, the loader lookup, the guard."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.attribution import explanation_context
from lightning_xai.callbacks import AuditCallback, AuditPrediction, BatchResult
from lightning_xai.callbacks import base as callback_base
from lightning_xai.callbacks._audit import runner as audit_runner
from lightning_xai.callbacks._audit import subset as audit_subset
from lightning_xai.callbacks._audit.guard import audit_guard
from lightning_xai.data import collate
from lightning_xai.models import AttentionClassifier


class _Confidence(AuditCallback):
    """A new-style audit: reads the shared prediction, computes no forward pass of its own."""

    name = "confidence"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.received = []

    def audit_batch(self, model, batch, generator, indices, prediction=None):
        self.received.append(prediction)
        return BatchResult(
            values={"margin": prediction.probabilities.max(-1).values - prediction.probabilities.min(-1).values}
        ), {}


def _loaders(dm):
    train = torch.utils.data.DataLoader(dm.dataset("train"), batch_size=16, collate_fn=collate)
    val = torch.utils.data.DataLoader(dm.dataset("val"), batch_size=16, collate_fn=collate)
    return train, val


def test_the_prediction_step_runs_once_in_the_base_and_matches_the_model(kit, tmp_path):
    dm = kit.make_dm()
    model = kit.make_model(dm)
    new = _Confidence(num_samples=12, batch_size=4)
    kit.make_trainer(tmp_path, [new], max_epochs=1).fit(model, dm)
    assert len(new.received) == 3 and all(isinstance(p, AuditPrediction) for p in new.received)
    indices = new.audit_indices(None, "val")
    batch = collate([dm.dataset("val")[i] for i in indices])
    with torch.no_grad():
        probs = model.eval().forward_from_embeddings(model.embed(batch), batch).logits.float().softmax(-1)
    assert [e.prediction for e in new.latest.examples] == probs.argmax(-1).tolist()
    torch.testing.assert_close(torch.tensor([e.probability for e in new.latest.examples]), probs.max(-1).values)
    assert new.history[-1]["metrics"]["margin/mean"] > 0


def test_an_audit_batch_without_the_shared_prediction_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match=r"_OldStyle.audit_batch must take `prediction"):

        class _OldStyle(AuditCallback):  # noqa: F841 - written before the shared prediction step
            name = "old_style"

            def audit_batch(self, model, batch, generator, indices):
                return BatchResult(), {}


def test_an_audit_batch_returning_a_dict_is_told_to_return_a_batch_result():
    from types import SimpleNamespace

    from lightning_xai.callbacks._audit.failures import audit_finite_rows

    everything = SimpleNamespace(finite=torch.tensor([True, True]))
    with pytest.raises(TypeError, match=r"returned a dict where it returns \(BatchResult, extra\).*BatchResult\(maps="):
        audit_finite_rows(lambda b, i, p: ({"values": {}}, {}), {"x": torch.ones(2)}, [0, 1], everything)
    found, extra = audit_finite_rows(
        lambda b, i, p: (BatchResult(values={"v": b["x"]}), {"k": 1}), {"x": torch.ones(2)}, [0, 1], everything
    )
    assert found.values["v"].tolist() == [1.0, 1.0] and extra == {"k": 1}


def test_no_subclass_repeats_the_forward_softmax_argmax():
    for name in (
        "attention_audit",
        "erasure_audit",
        "attention_baselines",
        "impermissible",
        "adversarial_search",
        "sanity",
    ):
        source = inspect.getsource(importlib.import_module(f"lightning_xai.callbacks.{name}"))
        assert ".softmax(" not in source and "forward_from_embeddings(model.embed" not in source, name


def test_step_audits_find_plain_val_loaders_before_the_first_validation(kit, tmp_path):
    """Loaders handed to ``fit`` (no datamodule), an audit after step 1, before any validation has loaded them."""
    dm = kit.make_dm()
    train, val = _loaders(dm)
    audit = _Confidence(num_samples=10, every_n_epochs=0, every_n_train_steps=1, on_validate=False)
    kit.make_trainer(tmp_path, [audit], limit_train_batches=2).fit(kit.make_model(dm), train, val)
    assert [(r["global_step"], r["num_examples"]) for r in audit.history] == [(1, 10), (2, 10)]
    assert audit.audit_indices(None, "val") == sorted(
        torch.randperm(len(dm.dataset("val")), generator=torch.Generator().manual_seed(0))[:10].tolist()
    )
    # without validation Lightning never loads the loaders given to fit: a clear error, not a silent skip
    audit = _Confidence(num_samples=10, every_n_epochs=0, every_n_train_steps=1)
    with pytest.raises(MisconfigurationException, match="limit_val_batches=0.*pass a datamodule"):
        kit.make_trainer(tmp_path, [audit], limit_train_batches=2, limit_val_batches=0).fit(
            kit.make_model(dm), train, val
        )


class _OwnLoaders(AttentionClassifier):
    """The reference model bringing its own loaders through the LightningModule hooks (no datamodule)."""

    def train_dataloader(self):
        return _loaders(self.dm)[0]

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.dm.dataset("val"), batch_size=8, collate_fn=collate)


def _own_loaders(dm):
    model = _OwnLoaders(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8)
    model.dm = dm
    return model


def test_the_modules_own_dataloader_hooks_are_used(kit, tmp_path):
    dm = kit.make_dm()
    audit = _Confidence(num_samples=8, every_n_epochs=0, every_n_train_steps=2)
    kit.make_trainer(tmp_path, [audit], limit_train_batches=2, limit_val_batches=0).fit(_own_loaders(dm))
    assert [(r["global_step"], r["num_examples"]) for r in audit.history] == [(2, 8)]


def test_no_private_loop_attributes_are_read():
    for module in (callback_base, audit_runner, audit_subset):
        assert "_data_source" not in inspect.getsource(module)


def test_audit_guard_is_explanation_context_plus_the_random_state():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout()).train()
    net(torch.randn(3, 2)).sum().backward()
    grad = net[0].weight.grad
    seen = {}
    for name, guard in (("guard", lambda: audit_guard(net, seed=1)), ("context", lambda: explanation_context(net))):
        with torch.inference_mode():
            with guard():
                seen[name] = (
                    net[0].weight.grad,
                    net.training,
                    torch.is_grad_enabled(),
                    torch.is_inference_mode_enabled(),
                )
                net(torch.randn(3, 2)).sum().backward()
        assert net[0].weight.grad is grad and net.training  # the training step's gradient is back, untouched
    assert seen["guard"] == seen["context"] == (None, False, True, False)


def test_the_erasure_gradient_ranking_has_one_honest_name(kit, tmp_path):
    import warnings

    from lightning_xai.audits.erasure import ranking_scores
    from lightning_xai.callbacks import ErasureAudit

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = ErasureAudit(rankings=("attention", "attention_gradient"), num_samples=8, eraser=False)
        assert ErasureAudit().rankings == ["attention", "attention_gradient", "random"]
        # "gradient" is attribute()'s embedding gradient here as everywhere (its old meaning here was removed)
        assert ErasureAudit(rankings=("gradient", "attention_gradient")).rankings == ["gradient", "attention_gradient"]
    with pytest.raises(MisconfigurationException, match="distinct"):
        ErasureAudit(rankings=("attention_gradient", "attention_gradient"))

    dm = kit.make_dm()
    model = kit.make_model(dm)
    kit.make_trainer(tmp_path, [new]).fit(model, dm)
    logged = new.history[-1]["metrics"]
    assert "attention_gradient/flipped/mean" in logged and not any(k.startswith("gradient/") for k in logged)
    # the ranking is ∂logit/∂α (audits' "gradient" ranking), not attribute()'s embedding gradient
    example = new.latest.examples[0]
    batch = collate([dm.dataset("val")[example.index]])
    want = ranking_scores(model.eval(), batch, "gradient")[0][batch["mask"][0]]
    torch.testing.assert_close(torch.tensor(example.maps["attention_gradient"]), want.float(), rtol=1e-4, atol=1e-6)


def test_loading_plain_loaders_early_leaves_training_bit_identical(kit, tmp_path):
    """The lookup may run the val loop's setup_data() at fit start: training must not notice."""
    dm = kit.make_dm()

    def train(callbacks, root):
        torch.manual_seed(0)
        train_loader = torch.utils.data.DataLoader(dm.dataset("train"), batch_size=16, collate_fn=collate, shuffle=True)
        model = kit.make_model(dm, dropout=0.3)  # dropout and shuffling draw from the global RNG
        kit.make_trainer(root, callbacks, max_epochs=2, limit_train_batches=4).fit(model, train_loader, _loaders(dm)[1])
        return model.state_dict()

    plain = train([], tmp_path / "plain")
    audit = _Confidence(num_samples=8, every_n_epochs=1, every_n_train_steps=3)
    audited = train([audit], tmp_path / "audited")
    assert [r["global_step"] for r in audit.history] == [3, 4, 6, 8]
    for name in plain:
        assert torch.equal(plain[name], audited[name]), name
