"""Issue 30 items 7 and 8: the headline's words follow the sign of τ, read the common Lightning metric names, and
say when the cost budget skipped epochs (also on the written page)."""

from __future__ import annotations

import types

from lightning_xai.reporting import write_report
from lightning_xai.reporting.curves import training_panels
from lightning_xai.reporting.headline import headline_sentences


def _audit(taus, plan=None, epochs=(0,)):
    history = [
        {
            "stage": "fit",
            "epoch": e,
            "global_step": 10 * (e + 1),
            "split": "val",
            "num_examples": 256,
            "metrics": {f"kendall_tau/attention_vs_{m}/mean": t for m, t in taus.items()},
        }
        for e in epochs
    ]
    return types.SimpleNamespace(
        history=history,
        metrics=["kendall_tau"],
        log_prefix="attention_audit",
        plan=plan,
        budget=0.05,
        every_n_epochs=1,
        latest=None,
        version=1,
        histogram_keys=lambda examples: [],
        example_tokens=lambda *a: [],
    )


def test_a_negative_tau_is_never_called_agreement():
    negative = headline_sentences([_audit({"gradient": -0.244, "grad_x_input": -0.574})])["agreement"][0]
    assert "no agreement" in negative and "strong negative correlation with grad_x_input (τ -0.574" in negative
    assert " agreement (" not in negative and "strong agreement" not in negative
    mixed = headline_sentences([_audit({"gradient": 0.574, "grad_x_input": -0.244})])["agreement"][0]
    assert "strong agreement (largest τ 0.574, gradient)" in mixed
    assert "weak negative correlation with grad_x_input (τ -0.244: opposite rankings)" in mixed
    small = headline_sentences([_audit({"gradient": -0.05})])["agreement"][0]
    assert "no agreement (largest τ -0.050)" in small and "negative correlation" not in small


def test_the_common_lightning_metric_names_are_training_metrics():
    records = [
        {
            "stage": "fit",
            "epoch": e,
            "global_step": e,
            "metrics": {
                "train_loss": 0.7 - e / 10,
                "val_loss": 0.69,
                "val_acc": 0.5 + e / 10,
                "train/acc_epoch": 0.6,
                "lr": 1e-3,
            },
        }
        for e in range(2)
    ]
    line = headline_sentences([], records)["training"][0]
    assert line == "Training, epoch 1: train/acc_epoch 0.6, train_loss 0.6, val_acc 0.6, val_loss 0.69."
    panels = {title: names for title, _, names, _ in training_panels(records)}
    assert panels["loss"] == ["train_loss", "val_loss"] and panels["acc"] == ["val_acc", "train/acc_epoch"]


def test_the_report_says_which_epochs_the_budget_skipped(tmp_path):
    plan = types.SimpleNamespace(num_samples=128, cadence=3, share=0.045, fits=True)
    audit = _audit({"gradient": 0.3}, plan=plan, epochs=(0, 3, 6))
    audit.history[1]["num_examples"] = audit.history[2]["num_examples"] = 128
    training = [{"stage": "fit", "epoch": e, "global_step": e, "metrics": {"val_loss": 0.5}} for e in range(8)]
    lines = headline_sentences([audit], training)["training"]
    assert lines[1] == (
        "Audit schedule — attention_audit: the cost budget (5% of training time) changed the audit — "
        "every 3 epochs instead of every 1, 128 examples instead of 256 after the first audit "
        "(predicted share 4.5%). Epochs audited: 0, 3, 6; not audited: 1, 2, 4, 5, 7."
    )
    page = open(write_report([audit], str(tmp_path), png=False, training=training), encoding="utf-8").read()
    assert "not audited: 1, 2, 4, 5, 7." in page
    unchanged = _audit({"gradient": 0.3}, plan=types.SimpleNamespace(num_samples=256, cadence=1, share=0.01, fits=True))
    assert len(headline_sentences([unchanged], training)["training"]) == 1  # nothing to say
