"""Callback configuration, state keys, the non-invasive guard and the aggregation — no Trainer needed."""

from __future__ import annotations

import random

import numpy as np
import pytest
import pytorch_lightning as pl
import scipy.stats
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit, ImpermissibleAttentionMonitor
from lightning_xai.callbacks._audit.guard import audit_guard
from lightning_xai.metrics import summarize_values


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: AttentionAudit(every_n_epochs=-1), "every_n_epochs"),
        (lambda: AttentionAudit(every_n_train_steps=0), "every_n_train_steps"),
        (lambda: AttentionAudit(every_n_epochs=0, on_validate=False, on_test=False), "never run"),
        (lambda: AttentionAudit(num_samples=0), "num_samples"),
        (lambda: AttentionAudit(dataloader="dev"), "dataloader"),
        (lambda: AttentionAudit(seed=1.5), "seed"),
        (lambda: AttentionAudit(precision="16"), "precision"),
        (lambda: AttentionAudit(methods=()), "at least one attribution method"),
        (lambda: AttentionAudit(methods=("attention", "gradient")), "always computed"),
        (lambda: AttentionAudit(methods=("gradient", "gradient")), "duplicate"),
        (lambda: AttentionAudit(metrics=("kendal",)), "unknown metric 'kendal'"),
        (lambda: AttentionAudit(methods=("gradient",), pairs=[("attention", "lrp")]), "pair"),
        (lambda: AttentionAudit(methods=("gradient",), method_options={"leave_one_out": {}}), "method_options"),
        (lambda: AttentionAudit(metrics=("jsd",), metric_options={"topk_overlap": {"k": 2}}), "metric_options"),
        (lambda: ErasureAudit(rankings=("attention", "atention")), "unknown ranking 'atention'"),
        (lambda: ErasureAudit(rankings="attention"), "not a string"),
        (lambda: ErasureAudit(k=0), "k"),
        (lambda: ErasureAudit(decision_flip=False, eraser=False), "enable"),
        (lambda: ErasureAudit(aopc_bins=0.2), "list of sizes"),
        (lambda: ErasureAudit(aopc_bins=(0.1, 0, 1.5)), r"\[0, 1.5\]"),
        (lambda: AttentionBaselines(num_permutations=0), "num_permutations"),
        (lambda: AttentionBaselines(max_attention_bins=(0.5, 0.2)), "increasing"),
        (lambda: AttentionBaselines(permutation=False, uniform=False), "enable"),
        (lambda: ImpermissibleAttentionMonitor(threshold=0), "threshold"),
    ],
)
def test_bad_config_fails_at_init_with_a_named_error(make, message):
    with pytest.raises(MisconfigurationException, match=message):
        make()


def test_defaults_and_pairs():
    audit = AttentionAudit()
    # until setup sees the model: J&W's three (IG is opt-in: see DEFAULT_METHODS); test_default_methods_follow_the_model
    assert audit.methods == ["gradient", "grad_x_input", "leave_one_out"]
    assert audit.metrics == ["kendall_tau", "jsd", "topk_overlap"]
    assert len(audit.pairs) == 6 and ("gradient", "leave_one_out") in audit.pairs
    assert (audit.every_n_epochs, audit.every_n_train_steps, audit.num_samples, audit.dataloader) == (
        1,
        None,
        256,
        "val",
    )
    assert AttentionAudit(metrics=("jensen_shannon",)).metrics == ["jsd"]


class _HoldsABert(pl.LightningModule):
    """A user's module holding a transformers classifier (found by the callbacks, no protocol of its own)."""

    def __init__(self) -> None:
        super().__init__()
        import transformers

        config = transformers.BertConfig(
            vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
        )
        self.model = transformers.BertForSequenceClassification(config)


def test_default_methods_follow_the_model():
    """Leave-one-out is a default only where the model scores deletions itself (DeletionLogits: the BiLSTM)."""
    from lightning_xai.adapters.capabilities import DeletionLogits
    from lightning_xai.callbacks.attention_audit import DEFAULT_GRADIENT_METHODS, DEFAULT_METHODS
    from lightning_xai.models import AttentionClassifier

    bilstm = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
    assert isinstance(bilstm, DeletionLogits)
    audit = AttentionAudit()
    key = audit.state_key
    audit.setup(None, bilstm, "fit")
    assert tuple(audit.methods) == DEFAULT_METHODS and len(audit.pairs) == 6 and audit.state_key == key

    bert = _HoldsABert()
    audit.setup(None, bert, "fit")
    assert tuple(audit.methods) == DEFAULT_GRADIENT_METHODS == ("gradient", "grad_x_input")
    assert audit.pairs == [("attention", "gradient"), ("attention", "grad_x_input"), ("gradient", "grad_x_input")]
    assert audit.state_key == key  # a checkpoint written before or after setup restores into the same callback

    named = AttentionAudit(pairs=[("attention", "leave_one_out")])
    named.setup(None, bert, "fit")
    assert tuple(named.methods) == DEFAULT_METHODS and named.pairs == [("attention", "leave_one_out")]
    explicit = AttentionAudit(methods=("leave_one_out",))
    explicit.setup(None, bert, "fit")
    assert explicit.methods == ["leave_one_out"]


def test_state_keys_tell_instances_apart():
    keys = {
        AttentionAudit().state_key,
        AttentionAudit(seed=1).state_key,
        AttentionAudit(methods=("gradient",)).state_key,
        ErasureAudit().state_key,
        ErasureAudit(aopc_bins=(0.1, 0.5)).state_key,
        AttentionBaselines().state_key,
        ImpermissibleAttentionMonitor().state_key,
    }
    assert len(keys) == 7
    assert AttentionAudit().state_key == AttentionAudit().state_key


def test_a_log_prefix_or_a_precision_tells_two_audits_apart_and_the_default_keys_are_unchanged():
    # the key of a default audit is the one checkpoints written before log_prefix/precision joined it carry
    assert AttentionAudit().state_key == AttentionAudit()._generate_state_key(
        every_n_epochs=AttentionAudit().every_n_epochs,
        every_n_train_steps=None,
        num_samples=AttentionAudit().num_samples,
        dataloader="val",
        seed=0,
        methods="auto",
        metrics=("kendall_tau", "jsd", "topk_overlap"),
    )
    assert AttentionAudit(log_prefix=AttentionAudit().name).state_key == AttentionAudit().state_key
    keys = {
        AttentionAudit().state_key,
        AttentionAudit(log_prefix="fp32").state_key,
        AttentionAudit(precision="trainer").state_key,
        ErasureAudit(log_prefix="e2").state_key,
        ErasureAudit().state_key,
    }
    assert len(keys) == 5
    # Lightning refuses two stateful callbacks of one class with the same key; these two are accepted
    trainer = pl.Trainer(
        callbacks=[AttentionAudit(), AttentionAudit(precision="trainer", log_prefix="bf16")],
        logger=False,
        enable_checkpointing=False,
    )
    assert len({c.state_key for c in trainer.callbacks if isinstance(c, AttentionAudit)}) == 2


def test_state_dict_round_trip():
    audit = AttentionAudit()
    audit.history = [
        {
            "stage": "fit",
            "epoch": 0,
            "global_step": 3,
            "split": "val",
            "num_examples": 2,
            "metrics": {"kendall_tau/attention_vs_gradient/mean": 0.25},
        }
    ]
    state = audit.state_dict()
    other = AttentionAudit()
    other.load_state_dict(state)
    assert other.history == audit.history
    state["history"][0]["metrics"]["kendall_tau/attention_vs_gradient/mean"] = 9.0  # a copy, not a view
    assert other.history[0]["metrics"]["kendall_tau/attention_vs_gradient/mean"] == 0.25


def test_audit_guard_restores_rng_modes_requires_grad_and_grads():
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5), torch.nn.Linear(3, 1)).train()
    net[2].eval()
    net[0].weight.requires_grad_(False)
    net(torch.randn(2, 3)).sum().backward()
    grad_before = net[2].weight.grad.clone()
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    with torch.inference_mode():
        with audit_guard(net, seed=3) as generator:
            assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            assert not any(m.training for m in net.modules())
            random.random(), np.random.rand(), torch.rand(5)
            net[0].weight.requires_grad_(True)
            net(torch.randn(2, 3)).sum().backward()  # accumulates into .grad inside the audit
            first = torch.rand(2, generator=generator)
    assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])
    assert [m.training for m in net.modules()] == [True, True, True, False]
    assert not net[0].weight.requires_grad and net[0].weight.grad is None
    assert torch.equal(net[2].weight.grad, grad_before)
    assert torch.equal(first, torch.rand(2, generator=torch.Generator().manual_seed(3)))


def test_audit_guard_restores_even_on_error():
    net = torch.nn.Linear(2, 2).train()
    state = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="boom"):
        with audit_guard(net):
            torch.rand(3)
            raise RuntimeError("boom")
    assert net.training and torch.equal(torch.get_rng_state(), state)


def test_summarize_values_matches_numpy_and_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.random((40, 12)), rng.random((40, 12))
    taus, ps = zip(*[scipy.stats.kendalltau(x, y) for x, y in zip(a, b)])
    taus = list(taus) + [float("nan")]
    ps = list(ps) + [float("nan")]
    out = summarize_values(taus, ps)
    assert out["mean"] == pytest.approx(np.nanmean(taus))
    assert out["std"] == pytest.approx(np.nanstd(taus))
    assert out["significant_fraction"] == pytest.approx(np.mean(np.array(ps[:-1]) <= 0.05))
    assert (out["count"], out["undefined"]) == (40, 1)
