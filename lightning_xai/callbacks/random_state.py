"""Resume training's random stream: checkpoint the global random states, restore them when a run resumes."""
from __future__ import annotations

import random
from typing import Any, Dict, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_xai.lightning_compat import Callback

__all__ = ["RandomStateCheckpoint", "get_random_states", "set_random_states"]


def get_random_states() -> Dict[str, Any]:
    """The python, numpy, torch and (initialised) CUDA random states, as types ``torch.load(weights_only=True)``
    reads (Lightning loads checkpoints that way): tuples, ints, floats, strings and tensors.

    Example:
        >>> states = get_random_states()
        >>> first = torch.rand(2), np.random.rand(), random.random()
        >>> set_random_states(states)
        >>> again = torch.rand(2), np.random.rand(), random.random()
        >>> torch.equal(again[0], first[0]), again[1:] == first[1:]
        (True, True)
    """
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
            "cuda": torch.cuda.get_rng_state_all() if cuda else None}


def set_random_states(states: Dict[str, Any]) -> None:
    """Restore states from :func:`get_random_states` (CUDA's only when as many devices are visible)."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    elif cuda is not None:
        rank_zero_warn(f"RandomStateCheckpoint: the checkpoint holds {len(cuda)} CUDA random states but "
                       f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} devices are visible; "
                       "the CUDA random stream is not restored.")


class RandomStateCheckpoint(Callback):
    """Put the global random states (python, numpy, torch, CUDA) in every checkpoint and restore them when a run
    resumes, at the start of its first training epoch — so dropout and every other draw from the global
    generators continue as in a run that never stopped.

    Lightning restores weights, optimizer and loop counters, not the global random states: a run resumed with
    ``seed_everything(seed)`` draws its dropout masks from the seed's stream, not from where the stopped run
    was. Combined with a data module that checkpoints its shuffle (every data module of this package does, see
    :class:`~lightning_xai.data.loaders.SplitLoaders`), a run resumed from an epoch-end checkpoint trains — and
    is audited — bit-identically to one that never stopped. Opt-in: the audit callbacks never touch the global
    random states.

    Not reproduced: a resume from a mid-epoch checkpoint (Lightning restarts the epoch from a fresh iterator
    unless the loader is stateful), a shuffled ``DataLoader`` without its own ``generator`` (it draws its order
    from the global stream before the resumed epoch's first hook), draws made between the checkpoint and the
    next epoch's start by other code, and per-process streams under DDP (every process restores the states of
    the process that saved the checkpoint).

    Example:
        >>> callback = RandomStateCheckpoint()
        >>> saved = callback.state_dict()          # what a checkpoint holds
        >>> stopped_run_draws = torch.rand(3)
        >>> resumed = RandomStateCheckpoint()
        >>> resumed.load_state_dict(saved)
        >>> resumed.on_train_epoch_start(None, None)  # the resumed run's first epoch: states restored
        >>> torch.equal(torch.rand(3), stopped_run_draws)
        True
    """

    def __init__(self) -> None:
        super().__init__()
        self._restored: Optional[Dict[str, Any]] = None

    @override
    def state_dict(self) -> Dict[str, Any]:
        return get_random_states()

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._restored = dict(state_dict)

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._restored is not None:
            set_random_states(self._restored)
            self._restored = None
