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
RESTORED_SCRIPT = Path(__file__).with_name("restored_script.py")


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


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(180)
def test_an_explanation_leaves_a_sharded_model_with_its_sharded_trainable_parameters(tmp_path):
    """FSDP does not reshard the root group after its forward, and the gathered parameters it then registers copy
    ``requires_grad`` from the sharded ones. Before: leave-one-out (parameters frozen) left the root unsharded with
    frozen gathered parameters registered on the model, and the next training step's backward reached none of the
    root's parameters (embeddings, pooler, head); an audit so trained the model differently
    (tests/callbacks/test_sharded.py, the resume test)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, str(RESTORED_SCRIPT), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads((tmp_path / "restored.json").read_text())
    for method in ("gradient", "leave_one_out"):
        assert found[method] == {"sharded": True, "requires_grad": []}, method
    assert found["no_gradient"] == []


def test_inside_an_explanation_a_model_is_walked_once_to_know_whether_it_is_sharded(monkeypatch):
    import lightning_xai.adapters.sharding as sharding
    from lightning_xai.attribution import explanation_context

    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    walked = []
    original = sharding.fsdp_modules
    monkeypatch.setattr(sharding, "fsdp_modules", lambda model: walked.append(model) or original(model))
    is_sharded(net), is_sharded(net)
    assert len(walked) == 2  # outside: asked each time (a model may be sharded between two calls)
    walked.clear()
    with explanation_context(net):
        assert not any(is_sharded(net) for _ in range(5))
    assert walked == [net]
    walked.clear()
    other = torch.nn.Linear(2, 2)
    with sharding.sharding_settled(), sharding.sharding_settled():  # nested: one answer per model
        assert not is_sharded(net) and not is_sharded(other) and not is_sharded(net)
    assert walked == [net, other]
