"""Divergences and the impermissible mass refuse what is not a distribution (issue 29, "silent wrong numbers").

Before, ``jensen_shannon_divergence([3, 4], …)`` was −0.305, the JSD of logits 5.41 (the docstring promises
≤ ln 2), ``total_variation`` of unnormalised masses 3.0, [2, 2] against [2, 3] a bare broadcasting error; an
attention ×5 gave an impermissible mass of 1.58 without ``token_mask``, an int mask holding 2 doubled the mass,
and ``ImpermissibleAttentionMonitor`` logged 1.475. Now each is a ``ValueError`` naming the rows and the fix;
the happy paths (broadcast candidates, bf16 softmax, multi-head maps) keep their values.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy.spatial.distance import jensenshannon

from lightning_xai.metrics.functional import (
    impermissible_mass,
    jensen_shannon_divergence,
    kl_divergence,
    total_variation,
)

DIVERGENCES = [kl_divergence, jensen_shannon_divergence, total_variation]


@pytest.mark.parametrize("fn", DIVERGENCES, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "p,problem",
    [
        (torch.tensor([3.0, 4.0]), r"does not sum to 1 in rows \[0\] \(sums \[7.0\]\)"),
        (torch.tensor([[2.0, -1.0], [0.5, 0.5]]), r"negative entries in rows \[0\]"),
        (torch.tensor([[0.5, 0.5], [math.nan, 1.0]]), r"NaN or inf in rows \[1\]"),
        (torch.tensor([[[0.5, 0.5], [0.2, 0.2]]]), r"does not sum to 1 in rows \[\(0, 1\)\]"),
    ],
)
def test_not_a_distribution_is_refused_with_the_row_and_the_fix(fn, p, problem):
    q = torch.full(p.shape, 1.0 / p.shape[-1])
    with pytest.raises(ValueError, match=problem + r".*softmax\(-1\).*sum\(-1, keepdim=True\)"):
        fn(p, q)
    with pytest.raises(ValueError, match=problem):
        fn(q, p) if fn is total_variation else fn(p, q, 0.0)


@pytest.mark.parametrize("fn", DIVERGENCES, ids=lambda f: f.__name__)
def test_logits_are_refused(fn):
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    with pytest.raises(ValueError, match="negative entries"):
        fn(logits, logits.softmax(-1))


@pytest.mark.parametrize("fn", DIVERGENCES, ids=lambda f: f.__name__)
def test_shapes_that_do_not_match_name_both(fn):
    with pytest.raises(ValueError, match=r"\(2, 2\) and \(2, 3\).*same number of outcomes"):
        fn(torch.full((2, 2), 0.5), torch.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match=r"do not broadcast"):
        fn(torch.full((2, 4, 3), 1 / 3), torch.full((3, 1, 3), 1 / 3))


def test_happy_path_values_broadcasting_and_bf16():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(4, 5, 7, generator=g).softmax(-1)
    q = torch.randn(4, 1, 7, generator=g).softmax(-1)
    jsd = jensen_shannon_divergence(p, q, eps=0.0)
    for b in range(4):
        for k in range(5):
            want = jensenshannon(p[b, k].double().numpy(), q[b, 0].double().numpy()) ** 2
            assert float(jsd[b, k]) == pytest.approx(want, abs=1e-6)
    assert bool((jensen_shannon_divergence(p, q) <= math.log(2) + 1e-6).all())
    torch.testing.assert_close(total_variation(p, q), 0.5 * (p - q).abs().sum(-1))
    p16 = p.to(torch.bfloat16)  # softmax rounded to bf16 is within the dtype's tolerance
    assert torch.isfinite(kl_divergence(p16, q.to(torch.bfloat16))).all()


def test_impermissible_mass_refuses_five_times_attention_without_a_token_mask():
    attention = torch.tensor([[0.1, 0.3, 0.6], [0.5, 0.25, 0.25]])
    impermissible = torch.tensor([[True, False, True], [False, True, False]])
    torch.testing.assert_close(impermissible_mass(attention, impermissible), torch.tensor([0.7, 0.25]))
    with pytest.raises(ValueError, match=r"attention does not sum to 1 in rows \[0, 1\]"):
        impermissible_mass(5 * attention, impermissible)
    heads = torch.stack([attention, attention.flip(-1)], 1)  # [B, heads, T]
    torch.testing.assert_close(impermissible_mass(heads, impermissible), torch.tensor([[0.7, 0.7], [0.25, 0.25]]))
    with pytest.raises(ValueError, match=r"rows \[\(0, 1\)\]"):
        impermissible_mass(torch.stack([attention, 2 * attention], 1)[:1], impermissible[:1])


def test_impermissible_mass_refuses_a_mask_that_is_not_zero_or_one():
    attention = torch.tensor([[0.1, 0.3, 0.6], [0.5, 0.25, 0.25]])
    as_int = torch.tensor([[1, 0, 1], [0, 1, 0]])
    torch.testing.assert_close(impermissible_mass(attention, as_int), torch.tensor([0.7, 0.25]))
    doubled = torch.tensor([[1, 0, 1], [0, 2, 0]])
    with pytest.raises(ValueError, match=r"values other than 0 and 1 in rows \[1\].*impermissible.bool\(\)"):
        impermissible_mass(attention, doubled)
    with pytest.raises(ValueError, match=r"\[B, T\] mask"):
        impermissible_mass(attention, as_int[:, :2])


def test_impermissible_monitor_does_not_log_the_mass_of_five_times_attention(tmp_path):
    """The monitor (which calls impermissible_mass) warns with the cause and logs nothing, instead of mass 1.475;
    the same model with its own attention logs a mass in [0, 1]."""
    import dataclasses
    import warnings

    import pytorch_lightning as pl

    from lightning_xai.callbacks import ImpermissibleAttentionMonitor
    from lightning_xai.data import TextClassificationDataModule
    from lightning_xai.models import AttentionClassifier

    class PronounSlice(TextClassificationDataModule):
        def __init__(self, **kwargs) -> None:
            super().__init__("pronoun", **kwargs)

        def examples(self, split):
            return super().examples(split)[:24]

    class FiveTimes(AttentionClassifier):
        def forward_from_embeddings(self, embeddings, batch, *, attention_override=None):
            out = super().forward_from_embeddings(embeddings, batch, attention_override=attention_override)
            return dataclasses.replace(out, attention=self.scale * out.attention)

    for scale in (1.0, 5.0):
        dm = PronounSlice(batch_size=8, seed=0)
        dm.setup("fit")
        pl.seed_everything(0, verbose=False)
        model = FiveTimes(dm.vocab_size, dm.num_classes, embedding_dim=16, hidden_dim=8)
        model.scale = scale
        monitor = ImpermissibleAttentionMonitor(num_samples=8, batch_size=8)
        trainer = pl.Trainer(
            max_epochs=1,
            limit_train_batches=1,
            callbacks=[monitor],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(model, dm)
        if scale == 1.0:
            assert 0.0 <= monitor.history[-1]["metrics"]["mass/mean"] <= 1.0
        else:
            assert monitor.history == []
            assert any("attention does not sum to 1" in str(w.message) for w in caught)
