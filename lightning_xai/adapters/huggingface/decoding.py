"""Free decoding: a generation batch whose target is the model's own greedy output.

"Force decoding" explains a reference target (the batch's ``labels``); "free decoding" explains what the model
generates itself. :func:`greedy_targets` decodes greedily with the *explained* function — the adapter's own passes
from embeddings, eval mode, no cache — so each target token is exactly the argmax of the log-probabilities the
explanations read (``transformers``' ``generate`` may differ in near ties: cached attention, other kernels).
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import Tensor

from lightning_xai.adapters.checks import check_token_ids, evaluating
from lightning_xai.adapters.huggingface.steps import IGNORE_INDEX
from lightning_xai.adapters.protocol import Batch

__all__ = ["DECODER_KEYS", "greedy_targets"]

#: the keys of an encoder–decoder batch indexed by target step (left alone by batch surgery on the source)
DECODER_KEYS = ("labels", "decoder_input_ids", "decoder_attention_mask")


def _special_id(model: Any, name: str) -> Any:
    value = getattr(model.config, name, None)
    return value if value is not None else getattr(getattr(model, "generation_config", None), name, None)


@torch.no_grad()
def greedy_targets(adapter: Any, batch: Batch, max_new_tokens: int = 20) -> Dict[str, Any]:
    """``batch`` with ``labels`` the greedy continuation of ``adapter``'s generator (a ``HuggingFaceGenerationAdapter``).

    Generation stops at the model's end-of-sequence token (included in the target) or after ``max_new_tokens``.

    * causal LM: each row is rebuilt right-padded: its prompt (the real positions before its first target, or every
      non-pad position when the batch has no ``labels``), then the generated tokens; ``labels`` are -100 on the
      prompt and the pads; other ``[B, T]`` values of the batch are carried along (0/False on generated positions);
    * encoder–decoder: the source keys are kept, ``labels`` replaced (``decoder_input_ids`` and
      ``decoder_attention_mask`` dropped: the decoder reads the shifted labels).

    Raises:
        ValueError: ``max_new_tokens`` not a positive int; an encoder–decoder without ``decoder_start_token_id``.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int; got {max_new_tokens!r}.")
    model = adapter.model
    eos = _special_id(model, "eos_token_id")
    eos_ids = torch.tensor(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]), dtype=torch.long)
    pad = adapter.pad_token_id
    pad = pad if pad is not None else (int(eos_ids[0]) if eos_ids.numel() else 0)
    with evaluating(model):
        if adapter.encoder_decoder:
            return _encoder_decoder(adapter, batch, max_new_tokens, eos_ids, pad)
        return _causal(adapter, batch, max_new_tokens, eos_ids, pad)


def _encoder_decoder(adapter: Any, batch: Batch, steps: int, eos_ids: Tensor, pad: int) -> Dict[str, Any]:
    ids = batch["input_ids"]
    start = _special_id(adapter.model, "decoder_start_token_id")
    if start is None:
        raise ValueError(f"{type(adapter.model).__name__}'s config has no decoder_start_token_id to start decoding.")
    source = {k: v for k, v in batch.items() if k not in DECODER_KEYS}
    embeddings = adapter.embed(source)
    decoded = torch.full((ids.shape[0], 1), int(start), dtype=torch.long, device=ids.device)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    labels = []
    for _ in range(steps):
        output = adapter._model_output(embeddings, source, maps=False, decoder={"decoder_input_ids": decoded})
        token = output.logits[:, -1].argmax(-1)
        labels.append(token.masked_fill(done, IGNORE_INDEX))
        decoded = torch.cat([decoded, token.masked_fill(done, pad)[:, None]], 1)
        done = done | torch.isin(token, eos_ids.to(token.device))
        if bool(done.all()):
            break
    return {**source, "labels": torch.stack(labels, 1)}


def _causal(adapter: Any, batch: Batch, steps: int, eos_ids: Tensor, pad: int) -> Dict[str, Any]:
    ids, present = batch["input_ids"], adapter._attention_mask(batch).bool()
    if "labels" in batch:
        present = present & ((batch["labels"] != IGNORE_INDEX).long().cumsum(1) == 0)
    B, T = ids.shape
    lengths = present.sum(1)
    order = torch.sort((~present).to(torch.int8), dim=1, stable=True).indices  # each prompt moved to the front
    kept = present.gather(1, order)
    out_ids = torch.full((B, T + steps), pad, dtype=ids.dtype, device=ids.device)
    out_ids[:, :T] = ids.gather(1, order).masked_fill(~kept, pad)
    done = torch.zeros(B, dtype=torch.bool, device=ids.device)
    end = lengths.clone()
    rows = torch.arange(B, device=ids.device)
    for _ in range(steps):
        current = int(end.max())
        sub = {
            "input_ids": out_ids[:, :current],
            "attention_mask": (torch.arange(current, device=ids.device)[None, :] < end[:, None]).long(),
        }
        token = adapter._model_output(adapter.embed(sub), sub, maps=False).logits[rows, end - 1].argmax(-1)
        live = ~done
        out_ids[rows[live], end[live]] = token[live]
        end = end + live.long()
        done = done | torch.isin(token, eos_ids.to(token.device))
        if bool(done.all()):
            break
    width = int(end.max())
    positions = torch.arange(width, device=ids.device)[None, :]
    generated = (positions >= lengths[:, None]) & (positions < end[:, None])
    carried = [
        k
        for k, v in batch.items()
        if isinstance(v, Tensor)
        and v.dim() >= 2
        and tuple(v.shape[:2]) == (B, T)
        and k not in ("input_ids", "attention_mask", "labels")
    ]
    result = {k: v for k, v in batch.items() if k not in carried}
    result["input_ids"] = out_ids[:, :width]
    result["attention_mask"] = (positions < end[:, None]).to(adapter._attention_mask(batch).dtype)
    result["labels"] = out_ids[:, :width].masked_fill(~generated, IGNORE_INDEX)
    for key in carried:
        value = batch[key]
        shape = (B, T) + (1,) * (value.dim() - 2)
        moved = value.gather(1, order.view(shape).expand_as(value)).masked_fill(~kept.view(shape), 0)
        extended = moved.new_zeros((B, width) + tuple(value.shape[2:]))
        extended[:, : min(T, width)] = moved[:, : min(T, width)]
        result[key] = extended
    check_token_ids(result["input_ids"], adapter._embedding.num_embeddings)
    return result
