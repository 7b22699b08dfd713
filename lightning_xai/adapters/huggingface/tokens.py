"""Which positions of a plain Hugging Face batch are real tokens: ``attention_mask`` minus the special tokens.

The special tokens come from the tokenizer (``all_special_ids``) when one is known; without one, from the
model config's special-token ids (``bos``/``eos``/``cls``/``sep``, and the ``decoder_start_token_id`` an
encoder–decoder starts decoding with: T5's pad, a bert2bert ``EncoderDecoderModel``'s ``[CLS]``; a composite config's
``encoder`` sub-config is read too, since the source is the encoder's input; a config naming only ``pad_token_id``,
as BERT's does, names none); with neither, every non-pad position counts as a real token and
:func:`real_token_mask` says so once with a warning.
"""

from __future__ import annotations

import warnings
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["SPECIAL_ID_FIELDS", "real_token_mask", "special_token_ids"]

#: config fields read for special-token ids when no tokenizer is known
SPECIAL_ID_FIELDS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "cls_token_id",
    "sep_token_id",
    "decoder_start_token_id",
)


def special_token_ids(tokenizer: Any, config: Any) -> Tuple[List[int], str]:
    """The special-token ids and where they come from: ``"tokenizer"``, ``"config"`` or ``"none"``.

    Example:
        >>> from transformers import BertConfig, RobertaConfig
        >>> special_token_ids(None, RobertaConfig())
        ([0, 1, 2], 'config')
        >>> special_token_ids(None, BertConfig())
        ([0], 'none')
        >>> from transformers import EncoderDecoderConfig
        >>> bert2bert = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(), BertConfig(is_decoder=True))
        >>> bert2bert.decoder_start_token_id = 101  # [CLS] starts decoding
        >>> special_token_ids(None, bert2bert)
        ([0, 101], 'config')
    """
    if tokenizer is not None and getattr(tokenizer, "all_special_ids", None) is not None:
        return sorted(set(int(i) for i in tokenizer.all_special_ids)), "tokenizer"
    found = {}
    encoder = getattr(config, "encoder", None)  # EncoderDecoderConfig: the source's own config
    for source in (encoder, config) if hasattr(encoder, "to_dict") else (config,):
        for name in SPECIAL_ID_FIELDS:
            value = getattr(source, name, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            found.update({int(v): name for v in values if isinstance(v, int) and not isinstance(v, bool)})
    named = any(name != "pad_token_id" for name in found.values())
    return sorted(found), "config" if named else "none"


def real_token_mask(batch: Any, tokenizer: Any, config: Any, owner: Optional[Any] = None) -> Tensor:
    """``[B, T]`` bool: ``batch["attention_mask"]`` minus the special tokens (:func:`special_token_ids`).

    Warns once per ``owner`` (an object that may carry ``_warned_specials``) when no special token is known.

    Example:
        >>> from transformers import RobertaConfig
        >>> batch = {"input_ids": torch.tensor([[0, 7, 8, 2, 1]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 0]])}
        >>> real_token_mask(batch, None, RobertaConfig()).tolist()
        [[False, True, True, False, False]]
    """
    if "attention_mask" not in batch:
        raise KeyError(
            "Batch has no 'attention_mask' (1 at every non-pad position, special tokens included); "
            "collate with lightning_xai.data.hf.WordPieceCollator or the tokenizer's padding."
        )
    ids, source = special_token_ids(tokenizer, config)
    if source == "none" and not getattr(owner, "_warned_specials", False):
        warnings.warn(
            "No tokenizer is known and the model config names no special tokens besides pad, so "
            "[CLS]/[SEP]-like tokens count as real tokens in every explanation. Give the tokenizer: a "
            "`tokenizer` attribute on the LightningModule or DataModule, or the callback's/adapter's "
            "tokenizer=.",
            stacklevel=3,
        )
        if owner is not None:
            object.__setattr__(owner, "_warned_specials", True)
    special = torch.tensor(ids, dtype=torch.long, device=batch["input_ids"].device)
    return batch["attention_mask"].bool() & ~torch.isin(batch["input_ids"], special)
