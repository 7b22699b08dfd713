"""A 2-process DDP run (CPU, gloo) gives the same metric values as one process on the same data."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("ddp_metrics_script.py")


def _load_script():
    spec = importlib.util.spec_from_file_location("ddp_metrics_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _close(a: float, b: float, tol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= tol


@pytest.mark.ddp
@pytest.mark.slow
def test_ddp_synced_metrics_equal_single_process(tmp_path):
    out = tmp_path / "ddp.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(tmp_path / "root")],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["backend"] == "gloo"

    # the same data, the same model, one process, one pass
    script = _load_script()
    items = script.build_examples()
    from lightning_xai.data import TextClassificationDataModule

    dm = TextClassificationDataModule("sst2", batch_size=4, seed=0)
    dm.setup("fit")
    model = script.build_model(dm.vocab_size)
    metrics = script.make_metrics()
    for start in range(0, len(items), 8):
        script.update_all(metrics, model, script.collate_examples(items[start : start + 8]))
    single = script.as_floats(metrics)

    assert result["metrics"]["kendall"]["count"] == len(items)  # both halves were reduced, nothing duplicated
    assert result["metrics"]["flip"]["flip_rate"] > 0  # the decision-flip sums are exercised, not just NaN
    for name, values in single.items():
        # model-based metrics see other paddings/batch shapes in each process: float rounding only
        tol = 1e-5 if name in ("comprehensiveness", "aopc", "flip") else 1e-9
        for key, value in values.items():
            synced = result["metrics"][name][key]
            assert _close(synced, value, tol), (name, key, synced, value)
    assert torch.distributed.is_available()
