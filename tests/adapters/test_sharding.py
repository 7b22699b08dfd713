"""adapters.sharding.lockstep (issue 32): on a sharded model every forward pass is a collective, so processes whose
data-dependent loops would run different numbers of passes wait on each other forever. Inside ``lockstep`` each
such decision is process 0's, and the processes run the same passes whatever their own values say."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_xai.adapters.sharding import agree, agree_flag, gathered, is_sharded, lockstep

SCRIPT = Path(__file__).with_name("lockstep_script.py")


def _run(tmp_path: Path, mode: str, timeout: float):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(tmp_path), mode],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"the processes hung (killed after {timeout} s): {stderr[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, stderr[-3000:]
    return [json.loads((tmp_path / f"{mode}{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(180)
def test_decision_flips_run_the_same_passes_on_every_process_in_lockstep(tmp_path):
    apart = _run(tmp_path, "apart", timeout=120)
    assert apart[1]["passes"] < apart[0]["passes"]  # alone, process 1 stops after its first pass: they would hang
    together = _run(tmp_path, "lockstep", timeout=120)
    assert together[0] == apart[0]  # process 0 runs as it would alone
    assert together[1] == together[0]  # process 1 takes its decisions: the same passes, the same flips


def test_outside_lockstep_or_on_one_process_values_are_kept():
    value = torch.tensor([True, False])
    assert agree(value) is value and agree_flag(True) is True
    with lockstep():  # no process group: nothing to share
        assert torch.equal(agree(value), value) and agree_flag(False) is False


def test_an_unsharded_model_is_left_alone():
    net = torch.nn.Sequential(torch.nn.Embedding(4, 2), torch.nn.Linear(2, 2))
    assert not is_sharded(net)
    with gathered(net, [net[0], net[1]]):
        assert net[0].weight.shape == (4, 2)
