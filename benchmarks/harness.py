"""The benchmarks' harness: command line, timing, peak memory, result files and the tables of the README.

Every benchmark compares configurations *in one run, on the same model and batch*; timings are interleaved
(round-robin, the order rotated every round) so that load from other processes on a shared machine hits every
configuration alike, and the figure of merit is the ratio of medians.

Peak memory is the growth of the process's peak resident set size (``VmHWM`` in ``/proc/self/status``,
reset through ``/proc/self/clear_refs``) while one call runs, measured in a fresh subprocess per
configuration so that memory freed by an earlier configuration and kept by the allocator cannot hide a peak.

The models and data the benchmarks run on are in :mod:`benchmarks.models`; this module knows none of them.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results"
README = HERE / "README.md"


# --- command line ------------------------------------------------------------------------------------------------
def set_threads(threads: Optional[int] = None) -> int:
    """Use ``threads`` intra-op threads (default: ``$OMP_NUM_THREADS`` or 1) and return the number set."""
    import torch

    if threads is None:
        threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    return threads


def common_args(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batch-size", type=int, default=256, help="SST-2 dev sentences in the batch")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per configuration (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default $OMP_NUM_THREADS or 1)")
    parser.add_argument("--quick", action="store_true", help="smoke mode: tiny batch, few repeats, no memory runs")
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    return parser


# --- timing ------------------------------------------------------------------------------------------------------
def interleaved(fns: Dict[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1) -> Dict[str, List[float]]:
    """Time every function ``repeats`` times, round-robin with a rotating order; ``warmup`` untimed calls first."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            started = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - started)
    return times


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# --- peak memory -------------------------------------------------------------------------------------------------
def proc_status_kb(field: str) -> int:
    """The ``field`` line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_delta_mb(fn: Callable[[], Any]) -> float:
    """Peak RSS growth (MiB) while ``fn`` runs in *this* process (reset VmHWM, run, read VmHWM − VmRSS before)."""
    import gc

    gc.collect()
    reset_peak_rss()
    before = proc_status_kb("VmRSS")
    fn()
    return (proc_status_kb("VmHWM") - before) / 1024.0


def available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def memory_in_subprocess(module: str, config: str, extra: Sequence[str] = (), timeout: float = 1800) -> float:
    """Run ``python -m <module> --memory-of <config>`` in a fresh process; it prints the peak RSS delta (MiB)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", module, "--memory-of", config, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory run of {config} failed:\n{proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("PEAK_RSS_DELTA_MB="):
            return float(line.split("=", 1)[1])
    raise RuntimeError(f"memory run of {config} printed no PEAK_RSS_DELTA_MB:\n{proc.stdout[-2000:]}")


# --- result files and README tables ------------------------------------------------------------------------------
def environment(threads: int) -> Dict[str, Any]:
    import torch

    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {
        "utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "threads": threads,
        "loadavg_1_5_15": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "mem_available_mb": round(available_mb()),
    }


def command_line() -> str:
    threads = os.environ.get("OMP_NUM_THREADS")
    prefix = f"OMP_NUM_THREADS={threads} " if threads else ""
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return prefix + ".venv/bin/python " + " ".join([str(script), *sys.argv[1:]])


def save(name: str, result: Dict[str, Any], out: Optional[Path] = None) -> Path:
    path = out or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=float) + "\n")
    return path


def fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, float):
        if x != x:
            return "n/a"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 100:
            return f"{x:.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def table(rows: List[Sequence[Any]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def target_row(what: str, value: float, target: str, met: Optional[bool]) -> Tuple[str, str, str, str]:
    return (what, fmt(value), target, "n/a" if met is None else ("yes" if met else "**no**"))


def update_block(marker: str, block: str, readme: Path = README) -> bool:
    """Replace the text between ``<!-- marker -->`` and ``<!-- /marker -->`` in ``readme``; False if absent."""
    if not readme.exists():
        return False
    text = readme.read_text()
    pattern = re.compile(rf"(<!-- {re.escape(marker)} -->\n)(.*?)(<!-- /{re.escape(marker)} -->)", re.S)
    if not pattern.search(text):
        return False
    readme.write_text(pattern.sub(lambda m: m.group(1) + block.rstrip() + "\n" + m.group(3), text))
    return True
