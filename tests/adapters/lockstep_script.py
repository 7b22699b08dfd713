"""Run by tests/adapters/test_sharding.py: two gloo processes run ``decision_flip`` on the same batch, every forward
pass made a collective (as a pass of an FSDP2-sharded model is), with process 1's decisions falsified so that it
would stop after its first pass; each process writes its number of passes and its flip positions to JSON.

Usage: ``python lockstep_script.py OUT_DIR MODE``; ``MODE``: ``lockstep`` (inside ``adapters.sharding.lockstep``,
each pass an all-reduce) or ``apart`` (no lockstep and no collective: what each process would run alone).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "callbacks"))
from conftest import make_dm, make_model  # noqa: E402  (the callbacks tests' kit)

import lightning_xai.metrics.functional.decision_flips as flips  # noqa: E402
from lightning_xai.adapters.sharding import lockstep  # noqa: E402


def run(rank: int, root: str, mode: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/group", rank=rank, world_size=2)
    dm = make_dm(batch_size=8)
    model = make_model(dm).eval()
    batch = next(iter(dm.val_dataloader()))
    calls = [0]
    honest = flips.decisions

    def falsified(logits, head):
        """Read once per scored pass: counts the passes, makes each a collective (as a sharded model's all-gathers
        are), and on process 1 says every erased pass "flips" (the first two calls: the head check, the unerased
        decision)."""
        calls[0] += 1
        if mode == "lockstep":
            dist.all_reduce(torch.zeros(1))
        found = honest(logits, head)
        return found if rank == 0 or calls[0] <= 2 else 1 - found

    flips.decisions = falsified
    with lockstep(mode == "lockstep"):
        result = flips.decision_flip(model, batch, "attention")
    with open(os.path.join(root, f"{mode}{rank}.json"), "w") as handle:
        json.dump({"passes": calls[0], "items": result.items_removed.tolist()}, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
