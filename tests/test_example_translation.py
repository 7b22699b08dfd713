"""examples/translation_bible.py: the hand saliency maps against per-step autograd loops, and a tiny end-to-end run."""

import math
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def modules():
    sys.path.insert(0, str(EXAMPLES))
    import translation_bible
    import translation_model
    import translation_saliency

    yield translation_model, translation_saliency, translation_bible
    sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def tiny(modules):
    translation_model, _, _ = modules
    torch.manual_seed(0)
    settings = translation_model.ModelSettings(d_model=16, layers=2, heads=2, ffn_dim=32)
    model = translation_model.build_model(settings, 30, 25).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    source, target = [5, 9, 3, 17, 1], [4, 8, 8, 21, 6, 1]  # 4 source words, 5 target words, each + </s>
    return model, source, target


def _step_log_prob(model, embeds, target, t):
    decoder_input = torch.tensor([[0] + target[:-1]])
    logits = model(inputs_embeds=embeds, decoder_input_ids=decoder_input).logits
    return logits[0, t].log_softmax(-1)[target[t]]


def test_inputs_embeds_path_is_the_input_ids_path(modules, tiny):
    _, saliency, _ = modules
    model, source, target = tiny
    decoder_input = torch.tensor([[0] + target[:-1]])
    by_ids = model(input_ids=torch.tensor([source]), decoder_input_ids=decoder_input).logits
    by_embeds = model(
        inputs_embeds=saliency.source_embeddings(model, source).unsqueeze(0), decoder_input_ids=decoder_input
    ).logits
    torch.testing.assert_close(by_embeds, by_ids)


def test_gradient_maps_equal_one_backward_per_target_step(modules, tiny):
    _, saliency, _ = modules
    model, source, target = tiny
    base = saliency.source_embeddings(model, source)
    norms, products = [], []
    for t in range(len(target) - 1):
        embeds = base.clone().unsqueeze(0).requires_grad_(True)
        (grad,) = torch.autograd.grad(_step_log_prob(model, embeds, target, t), embeds)
        norms.append(grad[0, :-1].norm(dim=-1))
        products.append((grad[0, :-1] * base[:-1]).sum(-1).abs())
    gradient, grad_x_input = saliency.gradient_and_grad_x_input(model, source, target)
    assert gradient.shape == (4, 5)
    assert float(grad_x_input.max()) > 0 and float(gradient.min()) > 0
    # relative tolerance only: the values are small (a random model's log-probabilities are flat)
    torch.testing.assert_close(gradient, torch.stack(norms, 1), rtol=1e-4, atol=0)
    torch.testing.assert_close(grad_x_input, torch.stack(products, 1), rtol=1e-4, atol=0)
    torch.testing.assert_close(saliency.gradient(model, source, target), gradient)


def test_integrated_gradients_is_complete(modules, tiny):
    """Σ_s,E IG (signed, many nodes) = log p(y_t | x) − log p(y_t | source words zeroed): checked on the signed sum,
    recomputed here from the same quadrature the example uses."""
    _, saliency, _ = modules
    model, source, target = tiny
    base = saliency.source_embeddings(model, source)
    zeroed = base.clone()
    zeroed[:-1] = 0.0
    nodes, weights = saliency._gauss_legendre(24)
    for t in (0, 3):
        total = torch.zeros_like(base)
        for alpha, weight in zip(nodes, weights):
            embeds = (zeroed + alpha * (base - zeroed)).unsqueeze(0).requires_grad_(True)
            (grad,) = torch.autograd.grad(_step_log_prob(model, embeds, target, t), embeds)
            total += weight * grad[0]
        signed = (total * (base - zeroed)).sum(-1)[:-1]
        gap = _step_log_prob(model, base.unsqueeze(0), target, t) - _step_log_prob(
            model, zeroed.unsqueeze(0), target, t
        )
        assert float(signed.sum()) == pytest.approx(float(gap), abs=1e-4)
        ig = saliency.integrated_gradients(model, source, target, n_steps=24, rows_per_pass=7)
        torch.testing.assert_close(ig[:, t], signed.abs(), rtol=1e-3, atol=1e-7)


def test_cross_attention_rows_and_shift(modules, tiny):
    _, saliency, _ = modules
    model, source, target = tiny
    out = model(
        input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([[0] + target[:-1]]), output_attentions=True
    )
    maps = saliency.cross_attention(model, source, target)  # [L, H, S, T]
    assert maps.shape == (2, 2, 4, 5)
    torch.testing.assert_close(maps[1, 0], out.cross_attentions[1][0, 0, :5, :4].T)
    assert bool((maps.sum(2) <= 1 + 1e-6).all())  # the </s> column is left out of a distribution
    shifted = saliency.cross_attention(model, source, target + [1], shift=1)
    out = model(
        input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([[0] + target]), output_attentions=True
    )
    torch.testing.assert_close(shifted[0, 1], out.cross_attentions[0][0, 1, 1:6, :4].T)


def test_smooth_grad_without_noise_is_the_gradient(modules, tiny):
    _, saliency, _ = modules
    model, source, target = tiny
    smooth, attention = saliency.smooth_grad_and_attention(model, source, target, n_samples=2, noise_level=0.0)
    torch.testing.assert_close(smooth, saliency.gradient(model, source, target))
    torch.testing.assert_close(attention, saliency.cross_attention(model, source, target))


def test_corpus_bleu(modules):
    _, _, example = modules
    sentence = "in the beginning was the word".split()
    assert example.corpus_bleu([sentence], [sentence]) == pytest.approx(100.0)
    assert example.corpus_bleu([["a", "b"]], [["c", "d"]]) == 0.0
    # every n-gram of the hypothesis matches, but it has 6 words against 7: brevity penalty exp(1 − 7/6)
    assert example.corpus_bleu([sentence], [sentence + ["."]]) == pytest.approx(100 * math.exp(1 - 7 / 6))


@pytest.mark.slow
def test_tiny_run_gives_a_well_formed_table(modules):
    translation_model, _, example = modules
    settings = translation_model.ModelSettings(d_model=32, layers=2, heads=2, ffn_dim=64, epochs=1, train_verses=120)
    out = example.run(
        settings,
        test_verses=6,
        val_verses=4,
        heavy_verses=2,
        smooth_samples=2,
        ig_steps=4,
        cache=None,
        log=lambda _: None,
    )
    assert out["test_verses"] == 6 and out["heavy_verses"] == 2 and not out["cached"]
    assert set(out["best_heads"]) == {1, 2} and all(h.startswith(f"head {k}.") for k, h in out["best_heads"].items())
    cheap = {
        "cross-attention, layer 1, mean of heads",
        "cross-attention, layer 2, mean of heads",
        "cross-attention, mean of all layers and heads",
        "gradient (L2)",
        "grad×input (absolute)",
        "Shift-Att (Chen et al. 2020), layer 2, mean of heads",
        f"cross-attention, layer 2, best head on val ({out['best_heads'][2].split()[1]})",
    }
    heavy = {
        "SmoothGrad (2 samples, L2)",
        "integrated gradients (4 steps, zero baseline)",
        "smoothed attention (2 samples), layer 1, mean of heads",
    }
    model1 = "IBM Model 1, 5 EM iterations, grow-diag-final-and"
    assert cheap | {model1} <= set(out["force"]) and not heavy & set(out["force"])
    assert cheap | heavy | {model1} <= set(out["force_subset"])
    assert cheap | heavy <= set(out["free_subset"]) and model1 not in out["free"]
    for table in ("force", "force_subset", "free", "free_subset"):
        for name, scores in out[table].items():
            assert set(scores) == {"aer", "precision", "recall", "f1"}
            assert all(0.0 <= value <= 1.0 for value in scores.values()), (table, name, scores)
            assert scores["aer"] == pytest.approx(1 - scores["f1"])  # sure links only: AER = 1 − F1
    assert out["force"][model1]["aer"] < 0.8  # the statistical aligner works even on this tiny corpus
    for split in ("val", "test"):
        assert 0.0 <= out["force_decoding"][split]["token_accuracy"] <= 1.0
        assert out["force_decoding"][split]["perplexity"] >= 1.0
    assert 0.0 <= out["test_bleu_greedy"] <= 100.0
    table = example.report(out).splitlines()
    assert table[0].startswith("| method | force AER") and len(table) == 2 + len(out["force"])
    assert len(example.report(out, subset=True).splitlines()) == 2 + len(out["force_subset"])
