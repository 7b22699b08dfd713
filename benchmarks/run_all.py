"""Run every benchmark (``make bench``) and refresh the result blocks of ``benchmarks/README.md``.

Each benchmark writes ``benchmarks/results/<name>.json`` (every timing, the environment, the command) and a
markdown block; ``--update-readme`` (default on) pastes the blocks between the ``<!-- results:<name> -->``
markers of the README, leaving everything else (and other authors' sections) untouched.

Usage:
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/run_all.py                 # everything (~30-60 min on 2 cores)
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/run_all.py --only ig_reference kendall
    .venv/bin/python benchmarks/run_all.py --quick --no-update-readme        # smoke run, seconds
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common as C  # noqa: E402

README = C.HERE / "README.md"


def jobs(quick: bool):
    from benchmarks import bench_deception, bench_gradients, bench_ig, bench_kendall, bench_loo

    common = ["--quick"] if quick else []
    out = {}
    for model in ("reference", "unpacked"):
        out[f"ig_{model}"] = (bench_ig.main, ["--model", model] + common)
        out[f"loo_{model}"] = (bench_loo.main, ["--model", model] + common)
        out[f"gradients_{model}"] = (bench_gradients.main, ["--model", model] + common)
    out["kendall"] = (bench_kendall.main, common)
    out["deception"] = (bench_deception.main, common)
    return out


def callback_overhead(quick: bool):
    """The callbacks benchmark (written by its own author) runs as a script, if it exists."""
    script = C.HERE / "callback_overhead.py"
    if not script.exists():
        print("benchmarks/callback_overhead.py not present; skipped")
        return None
    cmd = [sys.executable, str(script)] + (["--quick"] if quick else [])
    env = dict(os.environ, PYTHONPATH=str(C.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=C.ROOT, env=env)
    return proc.returncode


def update_readme(name: str, block: str) -> bool:
    if not README.exists():
        return False
    text = README.read_text()
    pattern = re.compile(rf"(<!-- results:{re.escape(name)} -->\n)(.*?)(<!-- /results:{re.escape(name)} -->)", re.S)
    if not pattern.search(text):
        return False
    README.write_text(pattern.sub(lambda m: m.group(1) + block.rstrip() + "\n" + m.group(3), text))
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny batches and repeats (smoke test)")
    parser.add_argument("--only", nargs="*", default=None, help="names to run (default all, incl. callbacks)")
    parser.add_argument("--no-update-readme", dest="update", action="store_false")
    parser.add_argument("--results-dir", type=Path, default=None, help="write JSON here instead of results/")
    args = parser.parse_args(argv)
    threads = C.set_threads()
    failures = []
    started = time.time()
    for name, (fn, job_args) in jobs(args.quick).items():
        if args.only is not None and name not in args.only:
            continue
        print(f"\n=== {name} ({time.strftime('%H:%M:%S')}, threads {threads}) ===", flush=True)
        out = ["--out", str(args.results_dir / f"{name}.json")] if args.results_dir else []
        try:
            result = fn(job_args + out)
        except Exception:  # keep going: one broken benchmark must not hide the others' figures
            traceback.print_exc()
            failures.append(name)
            continue
        if args.update and not args.quick and result.get("markdown"):
            if not update_readme(name, result["markdown"]):
                print(f"(no <!-- results:{name} --> block in README.md; not pasted)")
    if args.only is None or "callbacks" in args.only:
        print(f"\n=== callbacks ({time.strftime('%H:%M:%S')}) ===", flush=True)
        rc = callback_overhead(args.quick)
        if rc not in (None, 0):
            failures.append("callbacks")
    print(f"\nall done in {time.time() - started:.0f} s; failures: {failures or 'none'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
