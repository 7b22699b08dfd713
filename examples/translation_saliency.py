"""Source × target score maps of a Marian translation model, one function per method (for translation_bible.py).

Every function takes the model, one verse's source ids (``… </s>``) and the target ids it is decoded with
(``… </s>``: the reference under force decoding, the model's own greedy output under free decoding) and explains,
for each target word ``t``, the step whose output is that word (decoder input ``<pad> y_<t``; Ding, Xu & Koehn
2019's setting). Maps are ``[S, T]`` over words (source ``</s>`` and the target ``</s>`` step left out) except the
attention ones, ``[L, H, S, T]`` (decoder layer, head).

The saliency objective of step ``t`` is log p(y_t | y_<t, x); gradients are taken w.r.t. the source word
embeddings as the encoder sees them (token embedding × √d_model, before positions), by hand with autograd: one
backward pass explains every target step at once, the verse being repeated once per step. These are the hand
versions of the package's ``attribute(...)`` methods of the same names (``gradient`` with L2 reduction,
``grad_x_input`` absolute, ``smooth_grad``, ``smooth_attention``, ``integrated_gradients`` with a zero baseline),
so that a generation-capable adapter can replace each function one for one.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor
from translation_model import PAD


def _decoder_inputs(target_ids: Sequence[int], rows: int) -> Tensor:
    return torch.tensor([PAD] + list(target_ids[:-1])).expand(rows, -1)


def source_embeddings(model: torch.nn.Module, source_ids: Sequence[int]) -> Tensor:
    """``[S+1, E]``: the encoder's input embeddings of the source words and ``</s>`` (scaled, no positions)."""
    encoder = model.get_encoder()
    with torch.no_grad():
        return encoder.embed_tokens(torch.tensor(source_ids)) * encoder.embed_scale


def _step_log_probs(
    model: torch.nn.Module, embeds: Tensor, target_ids: Sequence[int], step: Tensor, output_attentions: bool = False
) -> Tuple[Tensor, Tuple[Tensor, ...]]:
    """log p(y_step) for each row (row ``i`` scores its own decoder step ``step[i]``) and the cross-attentions."""
    rows = embeds.shape[0]
    out = model.model(
        inputs_embeds=embeds,
        attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
        decoder_input_ids=_decoder_inputs(target_ids, rows),
        output_attentions=output_attentions,
    )
    hidden = out.last_hidden_state[torch.arange(rows), step]  # [rows, E]
    logits = model.lm_head(hidden) + model.final_logits_bias
    chosen = torch.tensor(target_ids)[step]
    log_probs = logits.log_softmax(-1).gather(1, chosen.unsqueeze(1)).squeeze(1)
    return log_probs, (out.cross_attentions if output_attentions else ())


def cross_attention(
    model: torch.nn.Module, source_ids: Sequence[int], target_ids: Sequence[int], shift: int = 0
) -> Tensor:
    """``[L, H, S, T]`` cross-attention. ``shift=0``: the step that outputs target word t (Ding et al.);
    ``shift=1``: the step where t is the decoder input (Chen et al. 2020's Shift-Att); pass ``target_ids`` with
    one more token then, so that the last word has such a step."""
    embeds = source_embeddings(model, source_ids).unsqueeze(0)
    with torch.no_grad():
        out = model.model(
            inputs_embeds=embeds, decoder_input_ids=_decoder_inputs(target_ids, 1), output_attentions=True
        )
    T = len(target_ids) - 1 - shift
    stacked = torch.stack(out.cross_attentions)[:, 0]  # [L, H, T+1 steps, S+1]
    return stacked[:, :, shift : shift + T, :-1].transpose(2, 3)


def _input_gradients(
    model: torch.nn.Module, embeds: Tensor, target_ids: Sequence[int], *, output_attentions: bool = False
) -> Tuple[Tensor, Tuple[Tensor, ...]]:
    """``[T, S+1, E]`` gradient of log p(y_t) w.r.t. ``embeds`` (``[T, S+1, E]``, row t explains step t)."""
    T = embeds.shape[0]
    embeds = embeds.detach().requires_grad_(True)
    log_probs, attentions = _step_log_probs(model, embeds, target_ids, torch.arange(T), output_attentions)
    (grad,) = torch.autograd.grad(log_probs.sum(), embeds)
    return grad, attentions


def _repeat(model: torch.nn.Module, source_ids: Sequence[int], target_ids: Sequence[int]) -> Tensor:
    return source_embeddings(model, source_ids).expand(len(target_ids) - 1, -1, -1)


def gradient_and_grad_x_input(
    model: torch.nn.Module, source_ids: Sequence[int], target_ids: Sequence[int]
) -> Tuple[Tensor, Tensor]:
    """:func:`gradient` and :func:`grad_x_input` from one shared backward pass."""
    embeds = _repeat(model, source_ids, target_ids)
    grad, _ = _input_gradients(model, embeds, target_ids)
    return grad[:, :-1].norm(dim=-1).T, (grad * embeds)[:, :-1].sum(-1).abs().T


def gradient(model: torch.nn.Module, source_ids: Sequence[int], target_ids: Sequence[int]) -> Tensor:
    """``[S, T]`` L2 norm of d log p(y_t) / d e_s."""
    return gradient_and_grad_x_input(model, source_ids, target_ids)[0]


def grad_x_input(model: torch.nn.Module, source_ids: Sequence[int], target_ids: Sequence[int]) -> Tensor:
    """``[S, T]`` |Σ_E (d log p(y_t) / d e_s) · e_s|."""
    return gradient_and_grad_x_input(model, source_ids, target_ids)[1]


def smooth_grad_and_attention(
    model: torch.nn.Module,
    source_ids: Sequence[int],
    target_ids: Sequence[int],
    *,
    n_samples: int = 10,
    noise_level: float = 0.15,
    seed: int = 0,
) -> Tuple[Tensor, Tensor]:
    """SmoothGrad ``[S, T]`` (mean over noisy copies of the gradient L2 map) and smoothed attention
    ``[L, H, S, T]`` (mean cross-attention over the same copies; Ding & Koehn's smooth attention).

    Noise: N(0, σ²) on every source word embedding (``</s>`` left as is), σ = ``noise_level``·(max − min) of the
    verse's word-embedding entries (the package's convention); the same draw for all target steps of a sample.
    """
    base = _repeat(model, source_ids, target_ids)
    T, S1, E = base.shape
    words = base[0, :-1]
    sigma = noise_level * float(words.max() - words.min())
    generator = torch.Generator().manual_seed(seed)
    grads, attentions = torch.zeros(T, S1 - 1), None
    for _ in range(n_samples):
        noise = torch.randn((1, S1, E), generator=generator) * sigma
        noise[:, -1] = 0.0
        grad, cross = _input_gradients(model, base + noise, target_ids, output_attentions=True)
        grads += grad[:, :-1].norm(dim=-1)
        # row t of the batch decodes the same target: its step-t attention row is the one of target word t
        steps = torch.stack(cross)[:, torch.arange(T), :, torch.arange(T), :-1]  # [T, L, H, S]
        attentions = steps if attentions is None else attentions + steps
    return grads.T / n_samples, (attentions / n_samples).permute(1, 2, 3, 0)


def integrated_gradients(
    model: torch.nn.Module,
    source_ids: Sequence[int],
    target_ids: Sequence[int],
    *,
    n_steps: int = 16,
    rows_per_pass: int = 256,
) -> Tensor:
    """``[S, T]`` |Σ_E IG| with a zero baseline on the source words (``</s>`` kept), Gauss–Legendre nodes."""
    base = _repeat(model, source_ids, target_ids)
    T, S1, E = base.shape
    nodes, weights = _gauss_legendre(n_steps)
    word = torch.ones(S1, 1)
    word[-1] = 0.0
    total = torch.zeros(T, S1, E)
    per_pass = max(1, rows_per_pass // T)
    for first in range(0, n_steps, per_pass):
        alphas = nodes[first : first + per_pass]
        k = len(alphas)
        scaled = base.unsqueeze(0) * (1 - word + word * alphas.view(k, 1, 1, 1))  # [k, T, S+1, E]
        embeds = scaled.reshape(k * T, S1, E).detach().requires_grad_(True)
        log_probs, _ = _step_log_probs(model, embeds, target_ids, torch.arange(T).repeat(k))
        (grad,) = torch.autograd.grad(log_probs.sum(), embeds)
        total += (grad.view(k, T, S1, E) * weights[first : first + k].view(k, 1, 1, 1)).sum(0)
    return (total * base * word)[:, :-1].sum(-1).abs().T


def _gauss_legendre(n: int) -> Tuple[Tensor, Tensor]:
    import numpy as np

    x, w = np.polynomial.legendre.leggauss(n)
    return torch.tensor((x + 1) / 2, dtype=torch.float32), torch.tensor(w / 2, dtype=torch.float32)


@torch.no_grad()
def greedy_decode(
    model: torch.nn.Module, sources: Sequence[Sequence[int]], max_extra: int = 10, batch_size: int = 64
) -> List[List[int]]:
    """Greedy (free) decoding: each output's ids ending in ``</s>`` (forced at 1.5·|source| + ``max_extra``)."""
    from translation_model import EOS, collate

    outputs: List[List[int]] = []
    for first in range(0, len(sources), batch_size):
        chunk = list(sources[first : first + batch_size])
        batch = collate([(s, [EOS]) for s in chunk])
        encoded = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        limit = int(1.5 * max(len(s) for s in chunk)) + max_extra
        ids = torch.full((len(chunk), 1), PAD)
        done = torch.zeros(len(chunk), dtype=torch.bool)
        for _ in range(limit):
            out = model.model.decoder(
                input_ids=ids,
                encoder_hidden_states=encoded.last_hidden_state,
                encoder_attention_mask=batch["attention_mask"],
            )
            logits = model.lm_head(out.last_hidden_state[:, -1]) + model.final_logits_bias
            logits[:, PAD] = float("-inf")
            nxt = logits.argmax(-1).masked_fill(done, PAD)
            ids = torch.cat([ids, nxt.unsqueeze(1)], 1)
            done |= nxt.eq(EOS)
            if done.all():
                break
        for row in ids[:, 1:].tolist():
            words = [i for i in row if i not in (PAD, EOS)]
            outputs.append(words + [EOS])
    return outputs
