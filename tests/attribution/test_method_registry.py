"""A method's facts live in its registry record (issue 28): ``attribute`` reads them and holds methods to them, and
every module that registers methods is imported where the import contracts see it."""

from __future__ import annotations

import grimp
import pytest
import torch

from lightning_xai.attribution import (
    ATTRIBUTION_METHODS,
    PAIRWISE_INTERACTIONS,
    SCORES,
    SCORES_AND_DELTA,
    MethodRecord,
    attribute,
    method_record,
    register_method,
)


@pytest.fixture()
def registered():
    names = []

    def register(name, fn, **facts):
        register_method(name, **facts)(fn)
        names.append(name)
        return name

    yield register
    for name in names:
        ATTRIBUTION_METHODS.pop(name, None)


def test_the_built_in_methods_carry_their_facts():
    assert all(isinstance(r, MethodRecord) and r.name == n for n, r in ATTRIBUTION_METHODS.items())
    sensitive = {name for name, record in ATTRIBUTION_METHODS.items() if record.precision_sensitive}
    assert sensitive == {"leave_one_out", "integrated_gradients", "integrated_hessians"}
    returns = {name: record.returns for name, record in ATTRIBUTION_METHODS.items() if record.returns != SCORES}
    assert returns == {
        "integrated_gradients": SCORES_AND_DELTA,
        "lrp": SCORES_AND_DELTA,
        "attnlrp": SCORES_AND_DELTA,
        "integrated_hessians": PAIRWISE_INTERACTIONS,
    }
    assert method_record("integrated_hessians").has_interactions
    assert method_record("lrp").has_convergence_delta and not method_record("gradient").has_convergence_delta


def test_every_registering_module_is_a_static_import_of_the_package():
    """No method is registered by a module loaded behind import-linter's back (importlib on first use)."""
    graph = grimp.build_graph("lightning_xai")
    registering = {f.__module__ for f in (r.function for r in ATTRIBUTION_METHODS.values())}
    for module in registering:
        chain = graph.find_shortest_chain(importer="lightning_xai.attribution", imported=module)
        assert chain is not None, f"{module} registers a method but lightning_xai.attribution never imports it"


def test_declared_returns_are_checked(sst2_batch, trained_model, registered):
    def pair(model, batch, target, *, create_graph=False):
        scores = model.token_mask(batch).double()
        return scores, scores[:, :, None] * scores[:, None, :]

    name = registered("pair_products", pair, resolves_target=True)  # a tuple, but declared as a map only
    with pytest.raises(RuntimeError, match="registered with returns='scores'"):
        attribute(trained_model, sst2_batch, name)
    name = registered("pair_products", pair, resolves_target=True, returns=PAIRWISE_INTERACTIONS)
    scores, gamma = attribute(trained_model, sst2_batch, name)
    B, T = sst2_batch["input_ids"].shape
    assert gamma.shape == (B, T, T) and scores.shape == (B, T)

    def short(model, batch, target, *, create_graph=False):
        scores = model.token_mask(batch).double()
        return scores, scores

    name = registered("short_pairs", short, resolves_target=True, returns=PAIRWISE_INTERACTIONS)
    with pytest.raises(RuntimeError, match=r"second result must be \[B, T, T\]"):
        attribute(trained_model, sst2_batch, name)


def test_a_bad_fact_or_an_unknown_name_fails_with_the_choices():
    with pytest.raises(ValueError, match="returns must be one of"):
        register_method("bad", returns="scores_and_friends")
    assert "bad" not in ATTRIBUTION_METHODS
    with pytest.raises(ValueError, match="Unknown attribution method 'gradiant'.*known methods"):
        method_record("gradiant")


def test_a_captum_object_gets_a_record_from_its_own_has_convergence_delta(sst2_batch, trained_model):
    captum = pytest.importorskip("captum.attr")
    forward = lambda x: x  # noqa: E731 (replaced by the bridge)
    scores, delta = attribute(
        trained_model, sst2_batch, captum.IntegratedGradients(forward), n_steps=4, return_convergence_delta=True
    )
    assert scores.shape == sst2_batch["input_ids"].shape and delta.shape == (sst2_batch["input_ids"].shape[0],)
    assert isinstance(attribute(trained_model, sst2_batch, captum.Saliency(forward)), torch.Tensor)
