"""Leave-one-out: lightning_xai vs Captum FeatureAblation (one feature per token, best perturbations_per_eval).

Same model, batch (SST-2 dev, first 256 sentences) and target (predicted class); both score the drop of the
target probability. Configurations:

* ``ours_delete`` ``attribute(model, batch, "leave_one_out")`` — the default: the token is deleted (J&W);
  one variant per real token (Σ L_b rows).
* ``ours_pad``    ``mode="pad"``: the token's embedding is replaced by the pad token's — on the reference
  models the zero vector, exactly what Captum's FeatureAblation with baseline 0 computes, so the two maps are
  compared number for number (on MiniLM the [PAD] row is not 0, so the maps differ by design).
* ``captum_ppe<k>`` ``FeatureAblation`` on the embeddings, ``feature_mask`` = token position,
  ``baselines=0``, ``perturbations_per_eval=k``: T_max perturbed copies of the whole batch (B × T_max rows).

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_loo.py --model reference``
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from benchmarks import captum_baselines as CB  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks import models as M  # noqa: E402

SWEEP = (1, 4, 16, 64)
TARGETS = {"reference": 3.0, "unpacked": 2.0, "minilm": 2.0}  # minilm: issue 18


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.add_argument("--model", default="reference", choices=["reference", "unpacked", "minilm"])
    parser.add_argument(
        "--weights",
        default="trained",
        choices=["trained", "random"],
        help="reference weights trained 2 epochs on SST-2 (cached) or seeded random",
    )
    parser.add_argument("--sweep", type=int, nargs="*", default=list(SWEEP))
    parser.add_argument("--sweep-repeats", type=int, default=2)
    args = parser.parse_args(argv)
    threads = H.set_threads(args.threads)
    if args.quick:
        args.batch_size, args.repeats, args.sweep, args.sweep_repeats = min(args.batch_size, 8), 2, [4], 1
    warnings.filterwarnings("ignore", message="leave_one_out")
    from lightning_xai.attribution import attribute

    model, batch, target = M.model_batch_target(args.model, args.batch_size, args.weights)
    result = {
        "benchmark": "leave_one_out",
        "command": H.command_line(),
        "env": H.environment(threads),
        "model": args.model,
        "model_info": getattr(model, "bench_info", {}),
        "batch": M.batch_stats(batch),
    }
    captum = {
        f"captum_ppe{k}": (lambda k=k: CB.feature_ablation(model, batch, target, perturbations_per_eval=k))
        for k in args.sweep
    }
    sweep = H.interleaved(captum, repeats=args.sweep_repeats, warmup=0)
    best = min(sweep, key=lambda k: H.median(sweep[k]))
    result["captum_sweep_seconds"] = {k: H.median(v) for k, v in sweep.items()}
    result["captum_best"] = best
    fns = {
        "ours_delete": lambda: attribute(model, batch, "leave_one_out", target),
        "ours_pad": lambda: attribute(model, batch, "leave_one_out", target, mode="pad"),
        best: captum[best],
    }
    times = H.interleaved(fns, repeats=args.repeats, warmup=1)
    med = {k: H.median(v) for k, v in times.items()}
    result["seconds"] = {k: {"median": med[k], "all": v} for k, v in times.items()}
    n = batch["input_ids"].shape[0]
    result["sentences_per_second"] = {k: n / v for k, v in med.items()}
    ours_pad, theirs = fns["ours_pad"](), captum[best]()
    result["agreement_pad_vs_captum_max_abs"] = float((ours_pad - theirs).abs().max())
    result["ratios"] = {
        "delete_vs_captum_best": med[best] / med["ours_delete"],
        "pad_vs_captum_best": med[best] / med["ours_pad"],
    }
    goal = TARGETS[args.model]
    result["target"] = goal
    result["met"] = {k: v >= goal for k, v in result["ratios"].items()}
    result["markdown"] = markdown(result)
    path = H.save(f"loo_{args.model}", result, args.out)
    print(result["markdown"])
    print(f"\nsaved {path}")
    return result


def markdown(r: dict) -> str:
    b, med, best = r["batch"], {k: v["median"] for k, v in r["seconds"].items()}, r["captum_best"]
    lines = [
        f"**Leave-one-out, model `{r['model']}`**, batch {b['sentences']} sentences, T_max {b['max_len']}, "
        f"{b['real_tokens']} real tokens (Captum evaluates B × T_max = {b['padded_positions']} variants); "
        f"{r['env']['threads']} threads, {r['env']['utc']}, load {r['env']['loadavg_1_5_15']}.",
        "",
        f"Command: `{r['command']}`",
        "",
    ]
    rows = [(k, med[k], r["sentences_per_second"][k]) for k in ("ours_delete", "ours_pad", best)]
    lines.append(H.table(rows, ("configuration", "median s", "sentences/s")))
    lines += [
        "",
        "Captum perturbations_per_eval sweep (median s): "
        + ", ".join(f"{k[len('captum_ppe') :]}: {H.fmt(v)}" for k, v in r["captum_sweep_seconds"].items()),
        f"Max |ours_pad − Captum FeatureAblation| = {r['agreement_pad_vs_captum_max_abs']:.2e}.",
        "",
    ]
    goal = r["target"]
    trows = [
        H.target_row(
            "delete (default) vs Captum best",
            r["ratios"]["delete_vs_captum_best"],
            f"≥ {goal:g}×",
            r["met"]["delete_vs_captum_best"],
        ),
        H.target_row(
            "pad vs Captum best", r["ratios"]["pad_vs_captum_best"], f"≥ {goal:g}×", r["met"]["pad_vs_captum_best"]
        ),
    ]
    lines.append(H.table(trows, ("ratio", "value", "target", "met?")))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
