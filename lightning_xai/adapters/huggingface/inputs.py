"""Checks of a Hugging Face batch (and tokenizer) against the model it is fed to: vocabulary, position limits, token
types, and what a causal query row can see.

* :func:`check_tokenizer` — the tokenizer belongs to the checkpoint: no more tokens than embedding rows, the same
  pad/CLS/SEP ids as the config.

* :func:`position_offset` — RoBERTa-style embeddings number positions from ``padding_idx + 1``, so a model with
  ``max_position_embeddings=514`` holds 512 tokens; without the offset a 513-token batch fails deep inside the
  model with a bare ``index 514 is out of bounds``.
* :func:`warn_missing_token_types` — a model with several token types (``type_vocab_size > 1``, BERT's pair
  segments) fed a pair without ``token_type_ids`` reads both segments as the first: a different function from the
  one it was trained on, with no error. Warned once, naming the rows.
* :func:`check_sight` — a causal model's explained query row must see the tokens it is said to attend to.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch import Tensor, nn

__all__ = ["check_sight", "check_tokenizer", "pair_rows", "position_offset", "warn_missing_token_types"]


def position_offset(model: nn.Module) -> int:
    """The position ids the model's embeddings skip before the first token: ``padding_idx + 1`` when its position
    embedding table has a padding row (RoBERTa, XLM-R, CamemBERT, ...), else 0.

    Example:
        >>> from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel
        >>> small = dict(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
        >>> roberta, bert = RobertaModel(RobertaConfig(**small, pad_token_id=1)), BertModel(BertConfig(**small))
        >>> position_offset(roberta), position_offset(bert)
        (2, 0)
    """
    for module in model.modules():
        table = getattr(module, "position_embeddings", None)
        if isinstance(table, nn.Embedding):
            pad = table.padding_idx
            return int(pad) + 1 if pad is not None and pad >= 0 else 0
    return 0


def pair_rows(input_ids: Tensor, attention_mask: Tensor, separator: Optional[int] = None) -> Tensor:
    """``BoolTensor[B]``: rows holding two segments, i.e. the separator more than once among the attended positions.

    ``separator``: the ``[SEP]`` id (the tokenizer's or the config's); ``None`` takes each row's last attended id,
    which closes every BERT-style encoding (``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``).

    Example:
        >>> ids = torch.tensor([[2, 7, 3, 8, 3], [2, 7, 8, 3, 0]])
        >>> pair_rows(ids, (ids != 0).long()).tolist()
        [True, False]
    """
    attends = attention_mask != 0
    if separator is None:
        last = (attends.long() * torch.arange(attends.shape[1], device=attends.device)).argmax(1, keepdim=True)
        sep = input_ids.gather(1, last)
    else:
        sep = torch.full_like(input_ids[:, :1], int(separator))
    return ((input_ids == sep) & attends).sum(1) > 1


def warn_missing_token_types(batch: Any, config: Any, tokenizer: Any = None, owner: Any = None) -> None:
    """Warn (once per ``owner``) when a model with token types gets pairs without ``batch["token_type_ids"]``.

    Only rows that hold two segments (:func:`pair_rows`) are the problem: a single sentence's token types are all 0,
    which is the model's default.

    Example:
        >>> from transformers import BertConfig
        >>> ids = torch.tensor([[2, 7, 3, 8, 3]])
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_missing_token_types({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, BertConfig())
        >>> str(caught[0].message).split(":")[0]
        "The batch has no 'token_type_ids' but the model has 2 token types (type_vocab_size=2) and rows [0] hold two segments"
    """
    if "token_type_ids" in batch or getattr(owner, "_warned_token_types", False):
        return
    types = getattr(config, "type_vocab_size", None)
    if not isinstance(types, int) or types <= 1 or "attention_mask" not in batch:
        return
    separator = getattr(tokenizer, "sep_token_id", None)
    separator = separator if separator is not None else getattr(config, "sep_token_id", None)
    pairs = pair_rows(batch["input_ids"], batch["attention_mask"], separator)
    if not bool(pairs.any()):
        return
    rows = pairs.nonzero().flatten().tolist()
    warnings.warn(
        f"The batch has no 'token_type_ids' but the model has {types} token types (type_vocab_size={types}) "
        f"and rows {rows[:10]}{' ...' if len(rows) > 10 else ''} hold two segments: the model reads the "
        "second segment as the first (token type 0), a different function from the one trained on pairs, "
        "so its outputs and explanations change without an error. Pass the tokenizer's token_type_ids "
        "(WordPieceCollator keeps them; tokenizer(a, b, return_token_type_ids=True)).",
        UserWarning,
        stacklevel=3,
    )
    if owner is not None:
        object.__setattr__(owner, "_warned_token_types", True)


def check_tokenizer(tokenizer: Any, embedding: nn.Embedding, config: Any) -> None:
    """Raise when ``tokenizer`` is not the model's: more tokens than ``embedding`` has rows, or a pad/CLS/SEP id
    that differs from ``config``'s (``None`` tokenizer: nothing to check).

    Example:
        >>> class Tokenizer:
        ...     pad_token_id = 0
        ...     def __len__(self): return 6
        >>> check_tokenizer(Tokenizer(), nn.Embedding(5, 2), None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Tokenizer/model mismatch: the tokenizer has 6 tokens but the model's embedding table has 5 rows; ...
    """
    if tokenizer is None:
        return
    rows, size = embedding.num_embeddings, len(tokenizer)
    if size > rows:
        raise ValueError(
            f"Tokenizer/model mismatch: the tokenizer has {size} tokens but the model's embedding "
            f"table has {rows} rows; load the tokenizer that belongs to this checkpoint (or call "
            "model.resize_token_embeddings(len(tokenizer)) after adding tokens)."
        )
    for name in ("pad_token_id", "cls_token_id", "sep_token_id"):
        mine, theirs = getattr(tokenizer, name, None), getattr(config, name, None)
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(
                f"Tokenizer/model mismatch: tokenizer.{name}={mine} but model.config.{name}="
                f"{theirs}; load the tokenizer that belongs to this checkpoint."
            )


def check_sight(qmask: Tensor, mask: Tensor, query_index: Optional[int]) -> None:
    """Raise when a causal model's query row (``qmask``) sees fewer than two of its row's real tokens (``mask``)
    while the row has two or more: its attention would say nothing about them.

    Example:
        >>> mask = torch.tensor([[True, True, True]])
        >>> check_sight(torch.tensor([[False, False, True]]), mask, None)  # the last token sees all three
        >>> check_sight(torch.tensor([[True, False, False]]), mask, 0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the attention row read (query_index=0) of this causal model sees only 1 real token(s) of rows [0] ...
    """
    T = mask.shape[1]
    last = (qmask.long() * torch.arange(T, device=qmask.device)).amax(-1, keepdim=True)
    seen = (mask & (torch.arange(T, device=mask.device) <= last)).sum(-1)
    blind = (seen < 2) & (mask.sum(-1) >= 2)
    if bool(blind.any()):
        raise ValueError(
            f"the attention row read (query_index={query_index}) of this causal model sees "
            f"only {int(seen[blind].min())} real token(s) of rows {blind.nonzero().flatten().tolist()}"
            " that have two or more, so its attention says nothing about them. Leave query_index="
            "None (the adapter then reads each row's last non-pad token, the one the head pools)."
        )
