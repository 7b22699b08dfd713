"""Smoke test of benchmarks/: every benchmark runs end to end on 4 SST-2 sentences, 2 repeats (no timing checks).

Speed itself is measured by ``make bench``, never here; this only keeps the scripts from rotting and checks the
agreement figures they report (ours vs Captum / scipy) on the tiny batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# every benchmark here trains or loads a model and runs its whole script (about 100 s together on 2 cores)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QUICK = ["--quick", "--batch-size", "4", "--repeats", "2", "--weights", "random"]


def _run(module, args, tmp_path):
    out = tmp_path / "result.json"
    result = module.main(args + ["--out", str(out)])
    assert json.loads(out.read_text())["benchmark"] == result["benchmark"]
    assert result["markdown"].count("|") > 10
    return result


def test_ig_benchmark(tmp_path):
    from benchmarks import bench_ig

    r = _run(bench_ig, QUICK + ["--model", "reference"], tmp_path)
    assert r["agreement_ours_default_vs_captum_n50"] < 1e-5
    assert r["auto_steps"]["max"] >= 1 and r["forward_rows_per_sentence"]["ours_default"] >= 50
    assert set(r["ratios"]) >= {"throughput_vs_captum_default", "time_vs_captum_best", "auto_speedup_vs_captum_best"}


def test_loo_benchmark(tmp_path):
    from benchmarks import bench_loo

    r = _run(bench_loo, QUICK + ["--model", "unpacked"], tmp_path)
    assert r["agreement_pad_vs_captum_max_abs"] < 1e-5


def test_gradient_benchmark(tmp_path):
    from benchmarks import bench_gradients

    r = _run(bench_gradients, QUICK + ["--samples", "2"], tmp_path)
    assert max(r["agreement_max_abs"].values()) < 1e-5


def test_kendall_benchmark(tmp_path):
    from benchmarks import bench_kendall

    r = _run(bench_kendall, ["--quick", "--batch-size", "4", "--repeats", "2"], tmp_path)
    for setting in r["settings"].values():
        assert setting["max_abs_diff_tau"] < 1e-9


def test_deception_benchmark(tmp_path):
    from benchmarks import bench_deception

    r = _run(bench_deception, ["--quick"], tmp_path)
    assert r["steps_counted"]["plain"] == r["steps_counted"]["deception"] > 0


def test_loo_memory_benchmark(tmp_path):
    from benchmarks import bench_loo_memory

    r = _run(bench_loo_memory, ["--quick", "--repeats", "2"], tmp_path)
    assert r["max_abs_logit_diff"] < 1e-6 and r["batch"]["max_len"] == 64


def test_kendall_memory_benchmark(tmp_path):
    from benchmarks import bench_kendall_memory

    r = _run(bench_kendall_memory, ["--quick", "--repeats", "2"], tmp_path)
    assert list(r["lengths"]) == ["1000"] and r["memory_target_met"] is None  # quick: no memory runs


def test_erasure_memory_benchmark(tmp_path):
    from benchmarks import bench_erasure_memory

    r = _run(bench_erasure_memory, ["--quick"], tmp_path)
    assert r["max_abs_value_diff"] == 0.0 and r["same_nan_pattern"] and r["batch"]["pieces"] == 64


def test_gpu_check_runs_its_code_on_the_cpu(tmp_path):
    from benchmarks import gpu_check

    r = _run(gpu_check, ["--quick"], tmp_path)
    assert set(r["fit"]["audit_share"]) >= {"attention_ig", "attention_ig_bf16", "erasure_default"}
    assert r["throughput"]["maps"]["integrated_gradients"]["fraction_of_fwd_bwd_rate"] > 0
    assert r["ig_accuracy"]["gl50"]["rel_l1_err_max"] < 0.5 and r["ig_accuracy"]["gl50"]["mean_steps"] == 50


def test_ig_auto_benchmark(tmp_path):
    from benchmarks import bench_ig_auto

    r = _run(bench_ig_auto, ["--quick", "--model", "minilm", "--token-rtol", "0.01"], tmp_path)
    assert set(r["ratios"]) == {"auto", "auto_token_rtol_0.01"}
    assert r["mean_gradient_evaluations"]["gl50"] == 50 and r["mean_gradient_evaluations"]["auto"] >= 15
    assert r["rel_l1_error"]["gl50"]["max"] < 1e-3  # 50 nodes against the float64 reference on the random head


def test_step_overhead_benchmark_with_the_trainer_precision(tmp_path):
    from benchmarks import bench_step_overhead

    r = _run(
        bench_step_overhead, ["--quick", "--settings", "short", "--precision", "bf16-mixed", "--control"], tmp_path
    )
    short = r["settings"]["short"]
    assert r["precision"] == "bf16-mixed" and short["step"]["median"] > 0 and "control_step" in short


def test_audit_share_benchmark_on_the_trained_llama():
    from benchmarks import bench_audit_share

    r = bench_audit_share.main(["--quick", "--model", "llama", "--configs", "attention_default", "erasure_default"])
    assert r["info"]["dev_acc"] > 0.7  # trained (cached per machine), not random
    assert all(c["audit_s"] > 0 and c["share"] > 0 for c in r["configs"].values())
    assert r["loo_floor"]["forward_passes"] > 0


def test_generation_share_benchmark_audits_the_translation_model():
    from benchmarks import bench_generation_share

    r = bench_generation_share.main(["--quick", "--clock", "cpu"])
    assert set(r["configs"]) == {"attention_default", "alignment_default", "alignment_split"}
    assert all(c["audit_s"] > 0 and c["share"] > 0 and c["keys"] > 0 for c in r["configs"].values())
    assert r["info"]["train_verses"] == 7102 and r["full_batches"] > 100
    assert r["configs"]["alignment_split"]["sentences"] == r["info"]["val_verses"] == 157  # the default subset
    d = r["at_defaults"]
    assert d["audit_epochs"][0] == 0 and d["share"] == d["audit_s_total"] / d["train_s_total"]


def test_generation_share_at_the_defaults_follows_the_budgets_own_plan():
    from benchmarks.bench_generation_share import amortised

    # 10 s per 42 s epoch = 23.8 %: every 5th epoch fits 5 % (4.76 %); in 10 epochs the audits of epochs 0 and 5
    d = amortised(10.0, 157, 42.0, 10)
    assert (d["plan"]["cadence"], d["plan"]["num_samples"], d["audit_epochs"]) == (5, 157, [0, 5])
    assert d["share"] == pytest.approx(20.0 / 420.0)
    # 100 s: nothing fits at every 10th epoch; 128 verses (the floor) after the first, full audit
    d = amortised(100.0, 157, 42.0, 21)
    assert (d["plan"]["cadence"], d["plan"]["num_samples"], d["audit_epochs"]) == (10, 128, [0, 10, 20])
    assert d["share"] == pytest.approx((100.0 + 2 * 100.0 * 128 / 157) / (21 * 42.0))


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_sharded_memory_benchmark(tmp_path):
    from benchmarks import bench_sharded_memory

    r = _run(bench_sharded_memory, ["--quick"], tmp_path)
    assert [x["rank"] for x in r["ranks"]] == [0, 1]
    for rank in r["ranks"]:
        assert rank["audited"] == 4 and len(rank["audit_peak_growth_mib"]) == 1
        assert len(rank["train_step_peak_growth_mib"]) == 2
        assert rank["params_local_mib"] < rank["params_full_mib"]  # each process holds its shards only
