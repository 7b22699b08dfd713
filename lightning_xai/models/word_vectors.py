"""Word-vector files: read ``{word: vector}`` from a word2vec / GloVe / fastText text file (optionally ``.gz``) or a
torch ``.pt`` file, and write a trained model's vectors back (the two-stage recipe of
:mod:`~lightning_xai.models.embeddings`).
"""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

__all__ = ["PathLike", "read_word_vectors", "save_word_vectors"]

PathLike = Union[str, "os.PathLike[str]"]


def read_word_vectors(path: PathLike) -> Dict[str, Tensor]:
    """Read ``{word: vector}`` from a word-vector file.

    Formats: word2vec / fastText text (first line ``"<count> <dim>"``), GloVe text (no header), either
    optionally gzip-compressed (``.gz``); or a torch file (``.pt``/``.pth``) holding a dict of word -> 1-D
    tensor or list of floats. All vectors must have the same length.

    Args:
        path: the file.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a malformed line or vectors of different lengths (naming the line).

    Example:
        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "vec.txt")
        >>> _ = open(f, "w").write("2 3\\ngood 0.1 0.2 0.3\\nbad -0.1 0 0.5\\n")
        >>> vectors = read_word_vectors(f)
        >>> sorted(vectors), vectors["bad"].tolist()
        (['bad', 'good'], [-0.10000000149011612, 0.0, 0.5])
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"No word-vector file at {str(path)!r}; pass embeddings_path pointing to a "
            "word2vec/GloVe text file or a .pt file of {word: vector}."
        )
    if path.suffix in (".pt", ".pth"):
        return _read_torch_vectors(path)
    opener = (
        (lambda: io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8"))
        if path.suffix == ".gz"
        else (lambda: open(path, encoding="utf-8"))
    )
    vectors: Dict[str, Tensor] = {}
    dim: Optional[int] = None
    with opener() as handle:
        for line_no, line in enumerate(handle, start=1):
            fields = line.rstrip("\n\r").rstrip().split(" ")
            if not fields or fields == [""]:
                continue
            if line_no == 1 and len(fields) == 2 and all(f.isdigit() for f in fields):
                dim = int(fields[1])  # word2vec / fastText header "<count> <dim>"
                continue
            if dim is None:
                dim = len(fields) - 1
            if len(fields) < dim + 1 or dim < 1:
                raise ValueError(
                    f"{path}:{line_no}: expected a word followed by {dim} numbers, got "
                    f"{len(fields)} fields; is this a word2vec/GloVe text file?"
                )
            word = " ".join(fields[: len(fields) - dim])
            try:
                vectors[word] = torch.tensor([float(v) for v in fields[len(fields) - dim :]], dtype=torch.float32)
            except ValueError as error:
                raise ValueError(f"{path}:{line_no}: non-numeric vector entry ({error}).") from None
    if not vectors:
        raise ValueError(f"{path} holds no word vectors.")
    return vectors


def _read_torch_vectors(path: Path) -> Dict[str, Tensor]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{path} must hold a non-empty dict {{word: vector}}, got {type(data).__name__}.")
    vectors: Dict[str, Tensor] = {}
    for word, vector in data.items():
        vector = torch.as_tensor(vector, dtype=torch.float32)
        if not isinstance(word, str) or vector.dim() != 1:
            raise ValueError(
                f"{path}: entries must be word -> 1-D vector; got {word!r} -> shape {tuple(vector.shape)}."
            )
        vectors[word] = vector
    dims = {v.numel() for v in vectors.values()}
    if len(dims) != 1:
        raise ValueError(f"{path}: vectors have different lengths {sorted(dims)}; they must all be equal.")
    return vectors


def save_word_vectors(vocab: Sequence[str], weight: Tensor, path: PathLike, skip: Sequence[str] = ("<pad>",)) -> int:
    """Write the rows of an embedding table as a ``.pt`` file of ``{word: vector}``.

    The two-stage recipe: train a first model, save its (structured, task-shaped) vectors with this,
    and start a second model from them with ``embedding_init="file"`` and a small ``embedding_rms``.

    Args:
        vocab: the token of each row.
        weight: ``[len(vocab), E]`` embedding table (e.g. ``model.embedding.weight``).
        path: where to write (a ``.pt`` file).
        skip: tokens not to write.

    Returns:
        The number of vectors written.

    Example:
        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "stage1.pt")
        >>> save_word_vectors(["<pad>", "<unk>", "good"], torch.eye(3), f)
        2
        >>> read_word_vectors(f)["good"].tolist()
        [0.0, 0.0, 1.0]
    """
    if weight.dim() != 2 or weight.shape[0] != len(vocab):
        raise ValueError(
            f"weight has shape {tuple(weight.shape)} but the vocabulary has {len(vocab)} tokens; "
            "pass one row per token."
        )
    table = weight.detach().float().cpu()
    vectors = {word: table[i].clone() for i, word in enumerate(vocab) if word not in skip}
    torch.save(vectors, Path(path))
    return len(vectors)
