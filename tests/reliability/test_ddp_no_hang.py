"""Under DDP a failure on one process, at any stage of an audit, is agreed on by every process: none is left waiting
in a collective (2 CPU processes, gloo; the failures are injected by tests/reliability/ddp_failure_script.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

SCRIPT = Path(__file__).with_name("ddp_failure_script.py")
AUDIT_STAGES = ["prediction", "attribution", "metrics", "gather", "logging", "budget", "report"]
#: which process each stage fails on in the script (the logger and the report write on process 0 only)
FAILING = {
    "probe": 1,
    "prediction": 1,
    "attribution": 1,
    "metrics": 1,
    "gather": 1,
    "logging": 0,
    "budget": 1,
    "report": 0,
}


def _run(tmp_path: Path, strict: bool, stages: List[str], timeout: float) -> List[Dict[str, Any]]:
    """Both processes' results; a hang (a process waiting in a collective the other never reaches) fails here."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PL_DISABLE_FORK="1", PYTHONWARNINGS="ignore")
    env.pop("LOCAL_RANK", None)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(tmp_path), "1" if strict else "0", ",".join(stages)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own process group: both processes are killed on a hang
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"the DDP processes hung (killed after {timeout} s): {stderr[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # process 1, should it outlive process 0
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(420)
@pytest.mark.parametrize("strict", [False, True])
def test_a_failure_on_one_process_at_any_stage_of_an_audit_is_agreed_on_by_both(tmp_path, strict):
    ranks = _run(tmp_path, strict, AUDIT_STAGES, timeout=360)
    for stage in AUDIT_STAGES:
        failing, other = ranks[FAILING[stage]][stage], ranks[1 - FAILING[stage]][stage]
        message = f"injected {stage} failure on process {FAILING[stage]}"
        if strict:  # raised on both: the failing process its own error, the other one naming it
            assert failing["outcome"] == f"RuntimeError: {message}", (stage, failing)
            assert message in other["outcome"] and f"process {FAILING[stage]}" in other["outcome"], (stage, other)
            continue
        assert [r[stage]["outcome"] for r in ranks] == ["finished", "finished"], stage
        # one path on both processes: the same history and the same count of skipped audits
        assert ranks[0][stage]["history"] == ranks[1][stage]["history"], stage
        assert ranks[0][stage]["failures"] == ranks[1][stage]["failures"], stage
        said = [w for w in ranks[0][stage]["warnings"] if message in w]
        assert said, (stage, ranks[0][stage]["warnings"])
        if stage == "report":  # the audit itself succeeded; writing its report failed and was skipped
            assert [r[stage]["history"] for r in ranks] == [1, 1] and "AuditReport" in said[0]
        elif stage == "budget":  # the audit ran and is kept; sizing the next ones failed
            assert [r[stage]["failures"] for r in ranks] == [1, 1]
        else:  # skipped on both processes
            assert [r[stage]["history"] for r in ranks] == [0, 0], stage
            assert [r[stage]["failures"] for r in ranks] == [1, 1], stage


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_the_probe_failing_on_one_process_raises_the_same_clear_error_on_both(tmp_path):
    """Before: process 1 raised the MisconfigurationException, process 0 died on gloo's 'Connection closed by peer'."""
    ranks = _run(tmp_path, False, ["probe"], timeout=200)
    outcomes = [r["probe"]["outcome"] for r in ranks]
    message = "AttentionAudit needs the model's attention: injected probe failure on process 1"
    assert outcomes[1] == f"MisconfigurationException: {message}"
    assert outcomes[0].startswith("MisconfiguredOnAnotherProcess: ") and message in outcomes[0], outcomes[0]
    assert "process 1" in outcomes[0].split(message)[1]
    assert [r["probe"]["misconfigured"] for r in ranks] == [True, True]  # one exception class to catch on both
    assert [r["probe"]["history"] for r in ranks] == [0, 0]
