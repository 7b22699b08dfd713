"""Issue 14, the protocol boundary: bad inputs get a clear error or a defined result, never a silent wrong number.

NaN weights give NaN maps (and a warning), ids past the vocabulary and a missing mask a message naming the fix, an
empty batch an empty result, LRP in half precision an error naming precision, and an attention that is not a
distribution over the real tokens (5x the model's own) an error instead of an impermissible mass of 1.47.
Each scenario sits next to its happy path.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

from lightning_xai.adapters import ExplainOutput, check_attention_distribution
from lightning_xai.attribution import attribute
from lightning_xai.losses import ModelConsistentAdversary
from lightning_xai.metrics import KendallTau
from lightning_xai.metrics.functional import impermissible_mass, kendall_tau, topk_kendall_tau
from lightning_xai.models import AttentionClassifier


def _model(seed: int = 0, vocab_size: int = 50) -> AttentionClassifier:
    torch.manual_seed(seed)
    return AttentionClassifier(vocab_size, 2, embedding_dim=16, hidden_dim=8).eval()


def _batch():
    return {
        "input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]]),
        "mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool(),
    }


def _nan_model() -> AttentionClassifier:
    model = _model()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return model


# --- 1. NaN weights: NaN maps and a warning, not all-zero finite maps ------------------------------------------
@pytest.mark.parametrize(
    "method,options",
    [("gradient", {}), ("gradient", {"reduction": "abs_sum"}), ("smooth_grad", {"n_samples": 3}), ("grad_x_input", {})],
)
def test_nan_weights_give_nan_maps_and_a_warning(method, options):
    batch = _batch()
    with pytest.warns(RuntimeWarning, match="the model's logits are not finite"):
        scores = attribute(_nan_model(), batch, method, **options)
    assert torch.isnan(scores[batch["mask"]]).all()  # every real token: NaN, never a finite 0
    assert (scores[~batch["mask"]] == 0).all()  # pads stay exactly 0


@pytest.mark.parametrize("method", ["gradient", "smooth_grad"])
def test_finite_model_gives_finite_maps_without_warning(method):
    batch = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        scores = attribute(_model(), batch, method)
    assert torch.isfinite(scores).all() and (scores[batch["mask"]] > 0).all()
    assert (scores[~batch["mask"]] == 0).all()


def test_l2_gradient_stays_twice_differentiable_at_pads():
    # the NaN-propagating L2 keeps its zero-safe derivative at the pads: the map's graph is finite
    model = _model()
    scores = attribute(model, _batch(), "gradient", create_graph=True)
    (grad,) = torch.autograd.grad(scores.sum(), model.embedding.weight)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


# --- 2. ids past the vocabulary: the id, the table size and the fix --------------------------------------------
def test_ids_past_the_vocabulary_name_id_size_and_fix():
    batch = {"input_ids": torch.tensor([[3, 60, 4]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
    with pytest.raises(
        ValueError,
        match=r"id 60 but the embedding table has 50 rows.*Encode it with the model's "
        r"vocabulary",
    ):
        attribute(_model(), batch, "gradient")
    with pytest.raises(ValueError, match="id -1"):
        attribute(_model(), {"input_ids": torch.tensor([[3, -1]]), "mask": torch.ones(1, 2, dtype=torch.bool)})


def test_ids_inside_the_vocabulary_are_explained():
    batch = {"input_ids": torch.tensor([[3, 49, 4]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
    assert torch.isfinite(attribute(_model(), batch, "gradient")).all()


def test_adversary_with_a_base_of_another_vocabulary_is_refused_at_first_call():
    batch = _batch()
    adversary = _model(seed=1, vocab_size=60)
    objective = ModelConsistentAdversary(_model(seed=0, vocab_size=50))
    with pytest.raises(ValueError, match="base model's embedding table has 50 rows but the adversary's has 60"):
        objective(adversary(batch), batch, model=adversary)
    # without the model to compare, an id the base cannot read is named instead of a bare IndexError
    wide = {"input_ids": torch.tensor([[3, 55]]), "mask": torch.ones(1, 2, dtype=torch.bool)}
    with pytest.raises(ValueError, match="id 55 but the embedding table has 50 rows"):
        objective(adversary(wide), wide)
    # same size, other words: also refused
    base, other = _model(0), _model(1)
    base.vocab = ["<pad>"] + [f"w{i}" for i in range(49)]
    other.vocab = ["<pad>"] + [f"v{i}" for i in range(49)]
    with pytest.raises(ValueError, match="different vocabulary lists"):
        ModelConsistentAdversary(base)(other(batch), batch, model=other)


def test_adversary_with_the_base_vocabulary_trains():
    batch = _batch()
    adversary = _model(seed=1)
    objective = ModelConsistentAdversary(_model(seed=0), weight=0.1)
    loss = objective(adversary(batch), batch, model=adversary)
    loss.backward()
    assert torch.isfinite(loss) and any(p.grad is not None for p in adversary.parameters())


# --- 3. a batch without 'mask': check_batch's message, not KeyError: 'mask' --------------------------------------
def test_batch_without_mask_gets_the_clear_message():
    with pytest.raises(KeyError, match="Batch has no 'mask'; batches are dicts with 'input_ids', 'mask'"):
        attribute(_model(), {"input_ids": _batch()["input_ids"]}, "gradient")


def test_batch_with_mask_is_explained():
    assert attribute(_model(), _batch(), "gradient").shape == (2, 4)


# --- 4. an empty batch: an empty map, empty metric results, a no-op update ---------------------------------------
@pytest.mark.parametrize(
    "method", ["attention", "gradient", "grad_x_input", "integrated_gradients", "smooth_grad", "leave_one_out", "lrp"]
)
def test_empty_batch_gives_an_empty_map(method):
    empty = {"input_ids": torch.zeros(0, 4, dtype=torch.long), "mask": torch.zeros(0, 4, dtype=torch.bool)}
    scores = attribute(_model(), empty, method)
    assert scores.shape == (0, 4) and scores.is_floating_point()


def test_empty_batch_refuses_the_tuple_outputs_it_cannot_define():
    empty = {"input_ids": torch.zeros(0, 4, dtype=torch.long), "mask": torch.zeros(0, 4, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r"The batch is empty \(B = 0\).*return_convergence_delta"):
        attribute(_model(), empty, "integrated_gradients", return_convergence_delta=True)


def test_empty_batch_in_kendall_tau_and_its_metric():
    empty, none = torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.bool)
    for fn in (kendall_tau, topk_kendall_tau):
        tau, p = fn(empty, empty, none)
        assert tau.shape == (0,) and p.shape == (0,)
    a = torch.tensor([[0.1, 0.5, 0.3, 0.0], [1.0, 2.0, 3.0, 4.0]])
    b = torch.tensor([[0.2, 0.9, 0.1, 7.0], [4.0, 3.0, 2.0, 1.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    with_empty, without = KendallTau(), KendallTau()
    with_empty.update(a, b, mask)
    with_empty.update(empty, empty, none)  # a no-op
    without.update(a, b, mask)
    assert {k: float(v) for k, v in with_empty.compute().items()} == {k: float(v) for k, v in without.compute().items()}
    assert float(without.compute()["count"]) == 2


def test_nonempty_batch_in_kendall_tau():
    tau, _ = kendall_tau(
        torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3, dtype=torch.bool)
    )
    assert float(tau[0]) == 1.0


# --- 5. LRP in half precision: the cause is precision, the fix float32 --------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lrp_in_half_precision_names_precision_and_the_fix(dtype):
    with pytest.raises(
        ValueError,
        match=r"float32 or float64.*The cause is precision, not a missing rule: cast "
        r"the model to float32",
    ):
        attribute(_model().to(dtype), _batch(), "lrp")


def test_lrp_after_casting_back_to_float32_works():
    model = _model()
    reference = attribute(model, _batch(), "lrp")
    cast = attribute(_model().to(torch.bfloat16).float(), _batch(), "lrp")  # bf16-rounded weights, float32 run
    assert torch.isfinite(reference).all() and torch.isfinite(cast).all() and cast.shape == reference.shape


# --- 6. attention that is not a distribution over the real tokens ------------------------------------------------
class ScaledAttention(nn.Module):
    """A user's model implementing the protocol whose attention is ``scale`` × the reference model's."""

    def __init__(self, inner: AttentionClassifier, scale: float = 5.0) -> None:
        super().__init__()
        self.inner, self.scale = inner, scale

    def embed(self, batch):
        return self.inner.embed(batch)

    def token_mask(self, batch):
        return self.inner.token_mask(batch)

    def forward_from_embeddings(self, embeddings, batch, *, attention_override=None) -> ExplainOutput:
        out = self.inner.forward_from_embeddings(embeddings, batch, attention_override=attention_override)
        return dataclasses.replace(out, attention=self.scale * out.attention)


def test_five_times_attention_is_refused_by_attribute_and_impermissible_mass():
    batch = _batch()
    model = ScaledAttention(_model())
    with pytest.raises(
        ValueError,
        match=r"ScaledAttention's attention is not a distribution over the real tokens: "
        r"row 0 sums to 5 ",
    ):
        attribute(model, batch, "attention")
    impermissible = torch.tensor([[True, False, False, False], [False, True, False, False]])
    with torch.no_grad():
        attention = model.forward_from_embeddings(model.embed(batch), batch).attention
    with pytest.raises(ValueError, match="does not sum to 1"):  # was a silent mass above 1 (issues 14, 29)
        impermissible_mass(attention, impermissible)
    with pytest.raises(ValueError, match="sums to 5 over its real tokens"):
        impermissible_mass(attention, impermissible, token_mask=batch["mask"])


def test_a_distribution_over_the_real_tokens_is_accepted():
    batch = _batch()
    model = _model()
    scores = attribute(model, batch, "attention")
    assert torch.allclose(scores.sum(1), torch.ones(2))
    impermissible = torch.tensor([[True, False, False, False], [False, True, False, False]])
    mass = impermissible_mass(scores, impermissible, token_mask=batch["mask"])
    assert ((mass >= 0) & (mass <= 1)).all()
    # bf16 rounding of a softmax is within the dtype's tolerance
    check_attention_distribution(scores.to(torch.bfloat16), batch["mask"])


@pytest.mark.parametrize(
    "values,problem",
    [
        ([[0.5, 0.5, 0.1, 0.0]], "puts mass 0.1 on positions outside the token mask"),
        ([[1.5, -0.5, 0.0, 0.0]], "has a negative weight -0.5"),
        ([[float("nan"), 0.5, 0.0, 0.0]], "has NaN or infinite values"),
        ([[0.3, 0.3, 0.0, 0.0]], "sums to 0.6 over its real tokens"),
    ],
)
def test_attention_check_names_each_problem(values, problem):
    mask = torch.tensor([[True, True, False, False]])
    with pytest.raises(ValueError, match=problem):
        check_attention_distribution(torch.tensor(values), mask)
