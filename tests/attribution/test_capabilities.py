"""Issue 13: the generic layers ask for capabilities (lightning_xai.adapters.capabilities), never for a model class.

Oracle: a model of its own class (not an AttentionClassifier subclass) that computes the same function as a reference
model, with the same weights, gets the same LRP map, shifted copy, leave-one-out and adversarial search — and a model
without a capability gets the generic path or a clear error naming the capability."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_xai.adapters import ExplainOutput
from lightning_xai.adapters.capabilities import DeletionLogits, EmbeddingShift, LinearHead, TokenEncoder
from lightning_xai.attribution import attribute, lrp
from lightning_xai.audits import adversarial_attention_search, input_invariance, shifted_model
from lightning_xai.models import AttentionClassifier
from lightning_xai.models.attention import masked_softmax


class OwnModel(nn.Module):
    """embedding -> encoder -> tanh attention -> linear head, written out; capabilities chosen per test."""

    def __init__(self, reference: AttentionClassifier) -> None:
        super().__init__()
        self.table = nn.Embedding.from_pretrained(reference.embedding.weight.detach().clone(), freeze=False)
        self.body = reference.encoder
        self.scorer = reference.attention
        self.head = reference.classifier

    def embed(self, batch):
        return self.table(batch["input_ids"])

    def token_mask(self, batch):
        return batch["mask"]

    def forward_from_embeddings(self, embeddings, batch, *, attention_override=None):
        mask = batch["mask"]
        hidden = self.body(embeddings, mask)
        alpha = (
            masked_softmax(self.scorer(hidden).masked_fill(~mask, float("-inf")), mask)
            if attention_override is None
            else attention_override.masked_fill(~mask, 0.0)
        )
        return ExplainOutput(
            logits=self.head(torch.einsum("bt,bth->bh", alpha, hidden)), attention=alpha, hidden_states=hidden
        )


class WithCapabilities(OwnModel):
    def linear_head(self):
        return self.head

    def token_encoder(self):
        return self.body

    def input_mask(self, batch):
        return batch["mask"]

    def embedding_table(self):
        return self.table.weight

    def shift_embeddings(self, shift):
        self.body.compensate_input_shift(shift)
        with torch.no_grad():
            self.table.weight.add_(shift)


@pytest.fixture(scope="module")
def reference(sst2):
    torch.manual_seed(0)
    return AttentionClassifier(sst2.vocab_size, 2, encoder="mlp", embedding_dim=12, hidden_dim=6).double().eval()


def test_reference_model_has_every_capability_and_a_plain_one_none(reference):
    for capability in (DeletionLogits, EmbeddingShift, LinearHead, TokenEncoder):
        assert isinstance(reference, capability)
        assert not isinstance(OwnModel(reference), capability)
    assert all(isinstance(WithCapabilities(reference), c) for c in (EmbeddingShift, LinearHead, TokenEncoder))


def test_lrp_reads_capabilities_not_the_class(reference, sst2_batch):
    own = WithCapabilities(reference).double().eval()
    expected, expected_delta = lrp(reference, sst2_batch, bias_factor=1.0, return_convergence_delta=True)
    relevance, delta = lrp(own, sst2_batch, bias_factor=1.0, return_convergence_delta=True)
    torch.testing.assert_close(relevance, expected, rtol=0, atol=1e-12)
    assert float(delta.abs().max()) < 1e-9 and torch.allclose(delta, expected_delta, atol=1e-12)
    with pytest.raises(ValueError, match="does not implement the LinearHead capability"):
        lrp(OwnModel(reference).double(), sst2_batch)


def test_input_invariance_shifts_through_the_capability(reference, sst2_batch):
    own = WithCapabilities(reference).double().eval()
    shift = torch.linspace(-1, 1, 12, dtype=torch.double)
    other = shifted_model(own, shift)
    torch.testing.assert_close(
        other.forward_from_embeddings(other.embed(sst2_batch), sst2_batch).logits,
        own.forward_from_embeddings(own.embed(sst2_batch), sst2_batch).logits,
        rtol=1e-10,
        atol=1e-10,
    )
    ours = input_invariance(own, sst2_batch, ["gradient", "grad_x_input"], shift=shift)
    theirs = input_invariance(reference, sst2_batch, ["gradient", "grad_x_input"], shift=shift)
    assert ours.column("relative_change") == pytest.approx(theirs.column("relative_change"), rel=1e-9)
    with pytest.raises(ValueError, match="does not implement the EmbeddingShift capability"):
        shifted_model(OwnModel(reference), 1.0)


def test_generic_paths_without_capabilities_give_the_same_numbers(reference, sst2_batch):
    plain = OwnModel(reference).double().eval()
    # leave-one-out: the reference scores deletions with deletion_logits only for (Bi)LSTMs; both re-run here
    torch.testing.assert_close(
        attribute(plain, sst2_batch, "leave_one_out"),
        attribute(reference, sst2_batch, "leave_one_out"),
        rtol=0,
        atol=1e-12,
    )
    # the adversarial search re-runs the model without LinearHead, pools linearly with it: same optimum
    fast = adversarial_attention_search(reference, sst2_batch, steps=20)
    slow = adversarial_attention_search(plain, sst2_batch, steps=20)
    torch.testing.assert_close(slow.candidate_jsd, fast.candidate_jsd, rtol=1e-7, atol=1e-9)
    assert torch.equal(slow.found, fast.found)
