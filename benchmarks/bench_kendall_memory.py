"""Kendall τ-b on long maps: peak memory and time of lightning_xai's ``kendall_tau`` against scipy.

One row of T tokens (T = 1,000 / 10,000 / 100,000; seeded random scores, the second map a noisy copy of the
first rounded to one decimal, so it has ties), all tokens real. ``kendall_tau`` is Knight's O(T log T) algorithm;
scipy's ``kendalltau`` is the same algorithm in numpy. The values are checked equal (τ to 1e-12, p relative
1e-9). Time: median of ``--repeats`` interleaved calls after a warm-up. Peak memory: growth of the peak RSS
while one call runs, in a fresh process per configuration (``benchmarks._common.peak_rss_delta_mb``).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_kendall_memory.py``
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common as C  # noqa: E402

LENGTHS = (1_000, 10_000, 100_000)
MEMORY_TARGET_MIB = 256.0


def inputs(length: int):
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, length, generator=g, dtype=torch.float64)
    y = (0.5 * x + torch.randn(1, length, generator=g, dtype=torch.float64)).round(decimals=1)
    return x, y, torch.ones(1, length, dtype=torch.bool)


def calls(length: int):
    from scipy.stats import kendalltau

    from lightning_xai.metrics.functional import kendall_tau

    x, y, mask = inputs(length)
    xs, ys = x[0].numpy(), y[0].numpy()
    return {"lightning_xai": lambda: kendall_tau(x, y, mask), "scipy": lambda: kendalltau(xs, ys)}


def memory_of(config: str, length: int) -> None:
    C.set_threads(None)
    fn = calls(length)[config]
    print(f"PEAK_RSS_DELTA_MB={C.peak_rss_delta_mb(fn):.1f}")


def main(argv=None) -> dict:
    parser = C.common_args(__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_of:
        memory_of(args.memory_of, args.length)
        return {}
    threads = C.set_threads(args.threads)
    lengths = [n for n in args.lengths if n <= 10_000] if args.quick else args.lengths  # --quick: no 100,000
    repeats = 2 if args.quick else args.repeats
    rows, result = [], {"command": C.command_line(), "environment": C.environment(threads), "lengths": {}}
    for length in lengths:
        fns = calls(length)
        ours, ref = fns["lightning_xai"](), fns["scipy"]()
        tau, p = float(ours[0][0]), float(ours[1][0])
        assert abs(tau - ref.statistic) <= 1e-12 and abs(p - ref.pvalue) <= 1e-9 * abs(ref.pvalue) + 1e-300, \
            (length, tau, ref.statistic, p, ref.pvalue)
        times = C.interleaved(fns, repeats=repeats)
        memory = {name: C.memory_in_subprocess("benchmarks.bench_kendall_memory", name, ["--length", str(length)])
                  for name in fns}
        entry = {"tau": tau, "p_value": p, "time_s": {k: C.median(v) for k, v in times.items()},
                 "peak_rss_delta_mib": memory}
        result["lengths"][str(length)] = entry
        rows.append((f"{length:,}", memory["lightning_xai"], memory["scipy"], 1e3 * entry["time_s"]["lightning_xai"],
                     1e3 * entry["time_s"]["scipy"]))
    worst = max(r[1] for r in rows)
    result["memory_target_met"] = worst <= MEMORY_TARGET_MIB
    result["table"] = C.table(rows, ["T", "peak RSS growth, ours (MiB)", "scipy (MiB)", "time, ours (ms)",
                                     "scipy (ms)"])
    print(result["command"])
    print(result["table"])
    print(f"target: peak RSS growth <= {MEMORY_TARGET_MIB:.0f} MiB at every T: "
          f"{'met' if result['memory_target_met'] else 'NOT met'} (worst {worst:.1f} MiB)")
    C.save("kendall_memory", result, args.out)
    return result


if __name__ == "__main__":
    main()
