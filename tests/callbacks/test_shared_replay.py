"""The audits that score attention overrides read their prediction from the pass of the batch's checked scorer."""

from __future__ import annotations

import warnings

import pytest
import torch

import lightning_xai.attribution.override_replay as override_replay
import lightning_xai.callbacks._audit.replay as shared
from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.callbacks import AttentionBaselines, ErasureAudit
from lightning_xai.callbacks._audit.guard import audit_guard
from lightning_xai.callbacks._audit.replay import SharedReplay

pytest.importorskip("transformers")
from tests.adapters.test_families import family_batch, family_model  # noqa: E402


def _audit(audit, model, batch, passes=None):
    """``(prediction, values)`` of one batch; ``passes`` gets the batch size of every ``forward_from_embeddings``."""
    if passes is not None:
        real = model.forward_from_embeddings
        model.forward_from_embeddings = lambda emb, *a, **k: passes.append(emb.shape[0]) or real(emb, *a, **k)
    with audit_guard(model.model, seed=audit.seed) as generator:
        prediction = audit.predict(model, batch)
        found, _ = audit.audit_batch(model, batch, generator, [0, 1, 2], prediction=prediction)
    return prediction, found.values


@pytest.mark.parametrize("kind", [ErasureAudit, AttentionBaselines])
def test_one_pass_serves_the_prediction_and_the_override_scorer(kind, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HuggingFaceAdapter(family_model("llama"))
    batch = family_batch("llama", False)
    audit = kind(num_samples=3)
    audit.explained_quantity, audit.generation = "probability", False
    made = []
    real = override_replay.override_scorer

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    for module in (
        shared,
        __import__(kind.__module__, fromlist=["_"]),
        __import__("lightning_xai.metrics.functional.erasure", fromlist=["_"]),
        __import__("lightning_xai.metrics.functional.decision_flips", fromlist=["_"]),
    ):
        if hasattr(module, "override_scorer"):
            monkeypatch.setattr(module, "override_scorer", counted)
    passes: list = []
    prediction, values = _audit(audit, model, batch, passes)
    del model.forward_from_embeddings
    assert len(made) == 1  # predict made it; audit_batch used it
    with torch.no_grad():
        own = model.forward_from_embeddings(model.embed(batch), batch).logits
    assert torch.equal(prediction.output.logits, own)  # the base class's prediction step, from the same pass
    # the oracle: the audit making its own scorer after the base class's prediction step
    monkeypatch.setattr(SharedReplay, "replay_for", lambda self, batch: None)
    monkeypatch.setattr(kind, "predict", lambda self, model, batch: super(kind, self).predict(model, batch))
    made.clear()
    unshared_passes: list = []
    _, unshared = _audit(audit, model, batch, unshared_passes)
    assert len(made) == 1 and values.keys() == unshared.keys()
    # one full pass of the batch fewer than a prediction step and a scorer made apart
    assert passes.count(3) == unshared_passes.count(3) - 1 and len(passes) == len(unshared_passes) - 1
    for name in values:
        assert torch.equal(values[name].nan_to_num(-9.0), unshared[name].nan_to_num(-9.0)), name


def test_a_scorer_is_handed_only_to_the_batch_it_was_made_for():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HuggingFaceAdapter(family_model("llama"))
    batch = family_batch("llama", False)
    keeper = SharedReplay()
    keeper.replayed_prediction(model, batch)
    assert keeper.replay_for(dict(batch)) is None  # an equal batch, another object
    assert keeper.replay_for(batch) is None  # forgotten after the first ask
