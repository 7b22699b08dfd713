"""Run every benchmark (``make bench``) and refresh the result blocks of ``benchmarks/README.md``.

Each benchmark writes ``benchmarks/results/<name>.json`` (every timing, the environment, the command) and a
markdown block; ``--update-readme`` (default on) pastes the blocks between the ``<!-- results:<name> -->``
markers of the README, leaving everything else (and other authors' sections) untouched.

Usage:
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/run_all.py                 # everything (~30-60 min on 2 cores)
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/run_all.py --only ig_reference kendall
    .venv/bin/python benchmarks/run_all.py --quick --no-update-readme        # smoke run, seconds (JSON to a temp folder)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness as H  # noqa: E402


def jobs(quick: bool):
    from benchmarks import (
        bench_deception,
        bench_erasure_memory,
        bench_gradients,
        bench_ig,
        bench_kendall,
        bench_kendall_memory,
        bench_loo,
        bench_loo_memory,
        bench_step_overhead,
    )

    common = ["--quick"] if quick else []
    out = {}
    for model in ("reference", "unpacked"):
        out[f"ig_{model}"] = (bench_ig.main, ["--model", model] + common)
        out[f"loo_{model}"] = (bench_loo.main, ["--model", model] + common)
        out[f"gradients_{model}"] = (bench_gradients.main, ["--model", model] + common)
    # MiniLM: 32 sentences (one IG run at 256 would take minutes on 2 cores); same comparisons otherwise
    out["ig_minilm"] = (bench_ig.main, ["--model", "minilm", "--batch-size", "32"] + common)
    # issue 18: n_steps="auto" against the 50-node default on the MiniLM users train (fine-tuned, cached); the quick
    # run uses the random-head MiniLM, which needs no fine-tuning
    from benchmarks import bench_ig_auto

    out["ig_auto_minilm_sst2"] = (
        bench_ig_auto.main,
        (
            ["--model", "minilm"]
            if quick
            else ["--model", "minilm_sst2", "--batch-size", "32", "--token-rtol", "0.01", "0.03"]
        )
        + common,
    )
    out["kendall"] = (bench_kendall.main, common)
    out["kendall_memory"] = (bench_kendall_memory.main, common)
    out["deception"] = (bench_deception.main, common)
    # issue 18: audit share of a training epoch (MiniLM audits 48 sentences, scaled to 256: see the README)
    from benchmarks import bench_audit_share

    out["audit_share_reference"] = (bench_audit_share.main, ["--model", "reference", "--train-batches", "20"] + common)
    out["audit_share_minilm"] = (
        bench_audit_share.main,
        ["--model", "minilm", "--train-batches", "4", "--rounds", "1", "--num-samples", "48"] + common,
    )
    out["audit_share_llama"] = (bench_audit_share.main, ["--model", "llama", "--train-batches", "40"] + common)
    # issue 30: the same Llama fine-tuned with LoRA (peft)
    out["audit_share_llama_lora"] = (
        bench_audit_share.main,
        [
            "--model",
            "llama_lora",
            "--train-batches",
            "20",
            "--configs",
            "attention_default",
            "erasure_default",
            "baselines_default",
        ]
        + common,
    )
    # issue 31: the generation audits' share of an epoch of the Greek→English translation model
    from benchmarks import bench_generation_share

    out["generation_share"] = (bench_generation_share.main, ["--train-batches", "20"] + common)
    out["loo_memory"] = (bench_loo_memory.main, common)
    out["erasure_memory"] = (bench_erasure_memory.main, common)
    out["step_overhead"] = (bench_step_overhead.main, common)
    # issue 32: per-process peak memory of an audit vs a training step under FSDP2 sharding (2 CPU processes)
    from benchmarks import bench_sharded_memory

    out["sharded_memory"] = (bench_sharded_memory.main, common)
    return out


def callback_overhead(quick: bool):
    """The callbacks benchmark (written by its own author) runs as a script, if it exists."""
    script = H.HERE / "callback_overhead.py"
    if not script.exists():
        print("benchmarks/callback_overhead.py not present; skipped")
        return None
    cmd = [sys.executable, str(script)] + (["--quick"] if quick else [])
    env = dict(os.environ, PYTHONPATH=str(H.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=H.ROOT, env=env)
    return proc.returncode


def _load(name: str, results_dir: Path):
    path = results_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


#: the translation example's figures (examples/translation_bible.py --json): AER of every map against human links
ALIGNMENT_RESULTS = H.ROOT / "examples" / "results" / "translation_bible.json"


def _alignment_rows(path: Path = ALIGNMENT_RESULTS) -> list:
    """The AER of each map of the translation model (force decoding, every test verse), beside the statistical
    aligners: quality figures of issue 31's summary table, not ratios with a target."""
    if not path.exists():
        return []
    r = json.loads(path.read_text())
    rows = []
    for key, verses in (("force", r["test_verses"]), ("force_subset", r["heavy_verses"])):
        where = f"`examples/translation_bible.py`, {verses} test verses"
        for method, v in r[key].items():
            if key == "force_subset" and method in r["force"]:
                continue  # the costly methods run on the first verses only; the others are in the full rows
            rows.append(
                (
                    f"AER of {method} vs human word alignments (translation, force decoding)",
                    H.fmt(v["aer"]),
                    "(lower: better)",
                    "n/a",
                    where,
                )
            )
    return rows


def summary(results_dir: Path = H.RESULTS) -> str:
    """One table of every acceptance ratio found in ``results_dir`` (value, target, met?, when)."""
    rows = []

    def add(what, value, target, met, r):
        rows.append(
            (
                what,
                H.fmt(value),
                target,
                "yes" if met else ("n/a" if met is None else "**no**"),
                f"{r['env']['utc'][11:]} load {r['env']['loadavg_1_5_15'][0]}, {r['env']['threads']} thr",
            )
        )

    for model in ("minilm", "reference", "llama", "llama_lora"):
        r = _load(f"audit_share_{model}", results_dir)
        for name, c in (r or {}).get("configs", {}).items():
            if c.get("target") is not None:
                add(
                    f"{name} audit share of a training epoch ({model})",
                    c["share"],
                    f"≤ {c['target']:.0%}",
                    c["share"] <= c["target"],
                    r,
                )
            if "vs_floor" in c:
                add(
                    f"leave-one-out audit / its floor of Σ L_i forwards ({model})",
                    c["vs_floor"],
                    "≤ 1.5×",
                    c["vs_floor"] <= 1.5,
                    r,
                )
    r = _load("generation_share", results_dir)
    cpu = ", CPU time" if (r or {}).get("clock") == "cpu" else ""
    for name, c in (r or {}).get("configs", {}).items():
        if c.get("target") is None:  # one audit of the whole default subset: no target of its own (the budget)
            add(
                f"{name}: one audit of the whole default subset, share of a training epoch (translation, "
                f"budget=None{cpu})",
                c["share"],
                "(none: the budget sets the cadence)",
                None,
                r,
            )
            continue
        add(
            f"{name} audit share of a training epoch (translation, {r['num_samples']} verses, budget=None{cpu})",
            c["share"],
            f"≤ {c['target']:.0%}",
            c["share"] <= c["target"],
            r,
        )
    d = (r or {}).get("at_defaults")
    if d:
        add(
            f"AlignmentAudit() at the defaults (budget 0.05: {d['plan']['num_samples']} verses every "
            f"{d['plan']['cadence']} epochs), share of {d['epochs']} training epochs (translation{cpu})",
            d["share"],
            f"≤ {d['target']:.0%}",
            d["share"] <= d["target"],
            r,
        )
    rows.extend(_alignment_rows())
    r = _load("ig_auto_minilm_sst2", results_dir)
    if r:
        for name, ratio in r["ratios"].items():
            add(
                f"IG {name} vs 50 fixed nodes ({r['model']}): speed, at p95 / max error ratio "
                f"{H.fmt(ratio['p95_error_vs_gl50'])} / {H.fmt(ratio['max_error_vs_gl50'])} (both ≤ 1 needed)",
                ratio["speed_vs_gl50"],
                "≥ 1.0×",
                r["met"][name],
                r,
            )
    for model in ("reference", "unpacked", "minilm"):
        r = _load(f"ig_{model}", results_dir)
        if r:
            ra, met = r["ratios"], r["met"]
            add(
                f"IG default vs Captum default, throughput ({model})",
                ra["throughput_vs_captum_default"],
                "≥ 1.8×",
                met["throughput_vs_captum_default"],
                r,
            )
            if "memory_vs_captum_default" in ra:
                add(
                    f"IG default vs Captum default, peak memory ({model})",
                    ra["memory_vs_captum_default"],
                    "≤ 0.25",
                    met["memory_vs_captum_default"],
                    r,
                )
            add(
                f"IG default time / Captum best-tuned ({model})",
                ra["time_vs_captum_best"],
                "≤ 1.15×",
                met["time_vs_captum_best"],
                r,
            )
            add(
                f"IG auto (rtol 0.01) speed-up vs Captum n=50 best ({model})",
                ra["auto_speedup_vs_captum_best"],
                "≥ 3×",
                met["auto_speedup_vs_captum_best"],
                r,
            )
            acc = r["accuracy_vs_300_steps"]
            add(
                f"IG auto p95 error / Captum n=50 p95 error ({model})",
                acc["ours_auto"]["rel_l1_p95"] / max(acc["captum_n50"]["rel_l1_p95"], 1e-12),
                "≤ 1",
                acc["ours_auto"]["rel_l1_p95"] <= acc["captum_n50"]["rel_l1_p95"],
                r,
            )
            if "rel_l1_max" in acc["ours_auto"]:
                add(
                    f"IG auto max error / Captum n=50 max error ({model})",
                    acc["ours_auto"]["rel_l1_max"] / max(acc["captum_n50"]["rel_l1_max"], 1e-12),
                    "≤ 1",
                    acc["ours_auto"]["rel_l1_max"] <= acc["captum_n50"]["rel_l1_max"],
                    r,
                )
            if "oracle" in r:
                add(
                    f"IG oracle bound: best per-sentence GL rule vs Captum n=50 at equal accuracy ({model})",
                    r["oracle"]["max_speedup_at_equal_accuracy"],
                    "(bound)",
                    None,
                    r,
                )
    for model in ("reference", "unpacked"):
        r = _load(f"loo_{model}", results_dir)
        if r:
            add(
                f"leave-one-out (delete, default) vs Captum FeatureAblation best ({model})",
                r["ratios"]["delete_vs_captum_best"],
                f"≥ {r['target']:g}×",
                r["met"]["delete_vs_captum_best"],
                r,
            )
            add(
                f"leave-one-out (pad) vs Captum FeatureAblation best ({model})",
                r["ratios"]["pad_vs_captum_best"],
                f"≥ {r['target']:g}×",
                r["met"]["pad_vs_captum_best"],
                r,
            )
        r = _load(f"gradients_{model}", results_dir)
        if r:
            for name, value in r["ratios"].items():
                add(f"{name} vs Captum ({model}), speed-up", value, "(none)", None, r)
    r = _load("kendall", results_dir)
    if r:
        for setting, s in r["settings"].items():
            add(f"Kendall τ vectorised vs scipy loop ({setting}, warm)", s["speedup"], "≥ 50×", s["met"], r)
            if "speedup_cold" in s:
                add(
                    f"Kendall τ vectorised vs scipy loop ({setting}, cold single call)",
                    s["speedup_cold"],
                    "(none)",
                    None,
                    r,
                )
    r = _load("loo_memory", results_dir)
    if r:
        add(
            "leave-one-out, one 2,000-token row: time chunked / one buffer",
            r["ratios"]["time_chunked_vs_one_buffer"],
            "≤ 1.2×",
            r["met"]["time_chunked_vs_one_buffer"],
            r,
        )
        if "chunked" in r["peak_rss_delta_mib"]:
            add(
                "leave-one-out, one 2,000-token row: peak RSS growth (MiB)",
                r["peak_rss_delta_mib"]["chunked"],
                "≤ 512",
                r["met"]["peak_memory_chunked"],
                r,
            )
    r = _load("kendall_memory", results_dir)
    if r and r.get("memory_target_met") is not None:
        worst = max(e["peak_rss_delta_mib"]["lightning_xai"] for e in r["lengths"].values())
        add(
            f"Kendall τ, one row of up to {max(int(t) for t in r['lengths']):,} tokens: peak RSS growth (MiB)",
            worst,
            "≤ 256",
            r["memory_target_met"],
            r,
        )
    r = _load("erasure_memory", results_dir)
    if r:
        add(
            "ErasureAudit, two 2,000-piece documents: time budgeted / unbudgeted",
            r["ratios"]["time_budgeted_vs_unbudgeted"],
            "≤ 1.2×",
            r["met"]["time_budgeted_vs_unbudgeted"],
            r,
        )
        if "budgeted" in r["peak_rss_delta_mib"]:
            add(
                "ErasureAudit, two 2,000-piece documents: peak RSS growth (MiB)",
                r["peak_rss_delta_mib"]["budgeted"],
                "≤ 1024",
                r["met"]["peak_memory_budgeted"],
                r,
            )
    r = _load("deception", results_dir)
    if r:
        add("DeceptionPenalty per-step overhead", r["overhead"], "≤ 0.05", r["met"], r)
    for name in ("step_overhead", "step_overhead_gpu"):
        r = _load(name, results_dir)
        if not r:
            continue
        for setting, s in r["settings"].items():
            where = f", {r['env']['gpu']} {r['precision']}" if r.get("accelerator") == "gpu" else ""
            add(
                f"MiniLM (sdpa) training step with the audit callbacks attached, between audits ({setting}, "
                f"batch {s['batch_size']}{where})",
                s["step"]["median"],
                f"≤ {r['target']:g}×",
                s["met"],
                r,
            )
    expected = [
        "ig_reference",
        "ig_unpacked",
        "ig_minilm",
        "loo_reference",
        "loo_unpacked",
        "gradients_reference",
        "gradients_unpacked",
        "kendall",
        "kendall_memory",
        "deception",
        "loo_memory",
        "erasure_memory",
        "step_overhead",
        "audit_share_minilm",
        "audit_share_reference",
        "audit_share_llama",
        "audit_share_llama_lora",
        "generation_share",
        "ig_auto_minilm_sst2",
    ]
    missing = [name for name in expected if _load(name, results_dir) is None]
    text = H.table(rows, ("ratio", "value", "target", "met?", "measured (UTC, 1-min load, threads)"))
    if missing:
        text += "\n\nNo result yet (not run, or did not finish): " + ", ".join(f"`{m}`" for m in missing) + "."
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny batches and repeats (smoke test)")
    parser.add_argument("--only", nargs="*", default=None, help="names to run (default all, incl. callbacks)")
    parser.add_argument("--no-update-readme", dest="update", action="store_false")
    parser.add_argument("--results-dir", type=Path, default=None, help="write JSON here instead of results/")
    parser.add_argument("--summary-only", action="store_true", help="rebuild the README blocks from results/*.json")
    args = parser.parse_args(argv)
    threads = H.set_threads()
    if args.quick and args.results_dir is None:  # a smoke run must not overwrite the measured results
        args.results_dir = Path(tempfile.mkdtemp(prefix="bench_quick_"))
    if args.summary_only:
        for path in sorted(H.RESULTS.glob("*.json")):
            block = json.loads(path.read_text()).get("markdown")
            if block:
                H.update_block(f"results:{path.stem}", block)
        H.update_block("summary", summary())
        print(summary())
        return 0
    failures = []
    started = time.time()
    for name, (fn, job_args) in jobs(args.quick).items():
        if args.only is not None and name not in args.only:
            continue
        print(f"\n=== {name} ({time.strftime('%H:%M:%S')}, threads {threads}) ===", flush=True)
        out = ["--out", str(args.results_dir / f"{name}.json")] if args.results_dir else []
        try:
            result = fn(job_args + out)
        except (Exception, SystemExit):  # keep going: one broken benchmark must not hide the others' figures
            traceback.print_exc()
            failures.append(name)
            continue
        if args.update and not args.quick and result.get("markdown"):
            if not H.update_block(f"results:{name}", result["markdown"]):
                print(f"(no <!-- results:{name} --> block in README.md; not pasted)")
    if args.only is None or "callbacks" in args.only:
        print(f"\n=== callbacks ({time.strftime('%H:%M:%S')}) ===", flush=True)
        rc = callback_overhead(args.quick)
        if rc not in (None, 0):
            failures.append("callbacks")
    if args.update and not args.quick:
        H.update_block("summary", summary())
    print(f"\nall done in {time.time() - started:.0f} s; failures: {failures or 'none'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
