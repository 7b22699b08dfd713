"""Resume training's random stream: checkpoint the global random states, restore them when a run resumes."""

from __future__ import annotations

from typing import Any, Dict, Optional

import pytorch_lightning as pl
from typing_extensions import override

from lightning_xai.attribution.context import get_random_states, set_random_states
from lightning_xai.lightning_compat import Callback

__all__ = ["RandomStateCheckpoint", "get_random_states", "set_random_states"]


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
        >>> import torch
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
