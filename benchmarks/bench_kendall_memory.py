"""Kendall τ-b on long maps: peak memory and time of lightning_xai's ``kendall_tau`` against scipy.

One row of T tokens (T = 1,000 / 10,000 / 100,000; seeded random scores, the second map a noisy copy of the
first rounded to one decimal, so it has ties), all tokens real. At these lengths ``kendall_tau`` is Knight's
O(T log T) algorithm (its pairwise fast path only takes rows of at most 128 tokens); scipy's ``kendalltau`` is the same
algorithm in numpy. The values are checked equal (τ to 1e-12, p relative
1e-9). Time: median of ``--repeats`` interleaved calls after a warm-up. Peak memory: growth of the peak RSS
while one call runs, in a fresh process per configuration (``benchmarks.harness.peak_rss_delta_mb``); ``--quick``
(the smoke test) runs T = 1,000 only, without the memory runs.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_kendall_memory.py``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness as H  # noqa: E402

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


def memory_of(config: str, length: int, threads) -> None:
    H.set_threads(threads)
    fn = calls(length)[config]
    print(f"PEAK_RSS_DELTA_MB={H.peak_rss_delta_mb(fn):.1f}")


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_of:  # the child process of one peak-memory measurement
        memory_of(args.memory_of, args.length, args.threads)
        return {}
    threads = H.set_threads(args.threads)
    if args.quick:
        args.lengths, args.repeats, args.no_memory = [n for n in args.lengths if n <= 1_000], 2, True
    result = {"benchmark": "kendall_memory", "command": H.command_line(), "env": H.environment(threads), "lengths": {}}
    rows = []
    for length in args.lengths:
        fns = calls(length)
        ours, ref = fns["lightning_xai"](), fns["scipy"]()
        tau, p = float(ours[0][0]), float(ours[1][0])
        assert abs(tau - ref.statistic) <= 1e-12 and abs(p - ref.pvalue) <= 1e-9 * abs(ref.pvalue) + 1e-300, (
            length,
            tau,
            ref.statistic,
            p,
            ref.pvalue,
        )
        times = H.interleaved(fns, repeats=args.repeats)
        extra = ["--length", str(length)] + (["--threads", str(args.threads)] if args.threads else [])
        memory = (
            {}
            if args.no_memory
            else {name: H.memory_in_subprocess("benchmarks.bench_kendall_memory", name, extra) for name in fns}
        )
        entry = {
            "tau": tau,
            "p_value": p,
            "time_s": {k: H.median(v) for k, v in times.items()},
            "time_s_all": times,
            "peak_rss_delta_mib": memory,
        }
        result["lengths"][str(length)] = entry
        rows.append(
            (
                f"{length:,}",
                memory.get("lightning_xai", float("nan")),
                memory.get("scipy", float("nan")),
                1e3 * entry["time_s"]["lightning_xai"],
                1e3 * entry["time_s"]["scipy"],
            )
        )
    measured = [r[1] for r in rows if r[1] == r[1]]
    worst = max(measured) if measured else float("nan")
    result["memory_target_met"] = (worst <= MEMORY_TARGET_MIB) if measured else None
    result["markdown"] = markdown(result, rows, worst)
    print(f"{result['markdown']}\n\nsaved {H.save('kendall_memory', result, args.out)}")
    return result


def markdown(r: dict, rows: list, worst: float) -> str:
    lines = [
        f"**Kendall τ-b of one long row** (all tokens real, ties in the second map); {r['env']['threads']} "
        f"threads, {r['env']['utc']}, load {r['env']['loadavg_1_5_15']}.",
        "",
        f"Command: `{r['command']}`",
        "",
        H.table(rows, ("T", "peak RSS growth, ours (MiB)", "scipy (MiB)", "time, ours (ms)", "scipy (ms)")),
        "",
    ]
    met = r["memory_target_met"]
    lines.append(
        f"Target ≤ {MEMORY_TARGET_MIB:g} MiB peak RSS growth at every T: "
        + (
            "not measured (--no-memory)"
            if met is None
            else f"{'met' if met else '**not met**'} (worst {H.fmt(worst)} MiB)"
        )
        + "."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
