"""Per-instance masked Kendall τ-b: lightning_xai's vectorised kendall_tau vs a scipy loop over instances.

Inputs: 256 instances × 50 tokens of seeded random scores, in three settings: all 50 tokens real and no ties;
SST-2 dev lengths (first 256 sentences, capped at 50) as the mask; and heavy ties (scores rounded to one
decimal) on all 50 tokens. The scipy loop is what users write:
``[kendalltau(a[b][m[b]], s[b][m[b]]) for b in range(B)]``. Both return τ and the p-value.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_kendall.py``
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import _common as C  # noqa: E402

TARGET = 50.0


def scipy_loop(a: torch.Tensor, s: torch.Tensor, m: torch.Tensor):
    from scipy.stats import kendalltau

    a, s, m = a.numpy(), s.numpy(), m.numpy()
    out = [kendalltau(a[b][m[b]], s[b][m[b]]) for b in range(a.shape[0])]
    return np.array([o.statistic for o in out]), np.array([o.pvalue for o in out])


def inputs(setting: str, B: int, T: int):
    g = torch.Generator().manual_seed(0)
    a, s = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    s = 0.5 * a + s  # correlated, like attention vs saliency
    mask = torch.ones(B, T, dtype=torch.bool)
    if setting == "sst2_lengths":
        lengths = C.sst2_dev_batch(B)["mask"].sum(1).clamp(max=T)
        mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    elif setting == "ties":
        a, s = (a * 10).round() / 10, (s * 10).round() / 10
    return a.double(), s.double(), mask


def main(argv=None) -> dict:
    parser = C.common_args(__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=50)
    args = parser.parse_args(argv)
    threads = C.set_threads(args.threads)
    if args.quick:
        args.batch_size, args.repeats = 4, 2
    from lightning_xai.metrics.functional import kendall_tau

    result = {"benchmark": "kendall_tau", "command": C.command_line(), "env": C.environment(threads),
              "shape": [args.batch_size, args.tokens], "settings": {}}
    for setting in ("all_real", "sst2_lengths", "ties"):
        a, s, m = inputs(setting, args.batch_size, args.tokens)
        from lightning_xai.metrics.functional.agreement import _pair_stats

        times = C.interleaved({"ours": lambda: kendall_tau(a, s, m), "scipy": lambda: scipy_loop(a, s, m),
                               "pair_stats": lambda: _pair_stats(a, s, m)},
                              repeats=args.repeats, warmup=1)
        tau, p = kendall_tau(a, s, m)
        ref_tau, ref_p = scipy_loop(a, s, m)
        med = {k: C.median(v) for k, v in times.items()}
        result["settings"][setting] = {
            "seconds": {k: {"median": med[k], "all": v} for k, v in times.items()},
            "speedup": med["scipy"] / med["ours"],
            "max_abs_diff_tau": float(np.nanmax(np.abs(tau.numpy() - ref_tau))),
            "max_abs_diff_p": float(np.nanmax(np.abs(p.numpy() - ref_p))),
            "met": med["scipy"] / med["ours"] >= TARGET,
            "pair_stats_share_of_ours": med["pair_stats"] / med["ours"]}
    result["markdown"] = markdown(result)
    path = C.save("kendall", result, args.out)
    print(result["markdown"])
    print(f"\nsaved {path}")
    return result


def markdown(r: dict) -> str:
    B, T = r["shape"]
    lines = [f"**Kendall τ-b per instance, {B} × {T} tokens**; {r['env']['threads']} threads, {r['env']['utc']}, "
             f"load {r['env']['loadavg_1_5_15']}.", "", f"Command: `{r['command']}`", ""]
    rows = []
    for name, s in r["settings"].items():
        rows.append((name, s["seconds"]["ours"]["median"] * 1e3, s["seconds"]["scipy"]["median"] * 1e3, s["speedup"],
                     "≥ 50×", "yes" if s["met"] else "**no**", f"{s['max_abs_diff_tau']:.1e} / {s['max_abs_diff_p']:.1e}"))
    lines.append(C.table(rows, ("setting", "ours ms", "scipy loop ms", "speed-up", "target", "met?",
                                "max abs diff τ / p vs scipy")))
    lines += ["", "Where our time goes: the pairwise kernel `agreement._pair_stats` takes " + ", ".join(
        f"{s['pair_stats_share_of_ours']:.0%} ({k})" for k, s in r["settings"].items()) + " of a call (the "
        "[B, T, T] pairwise comparisons); the rest is the tie statistics and p-values."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
