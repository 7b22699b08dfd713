"""``n_steps="auto"`` against 50 fixed Gauss–Legendre nodes, on the models users train (issue 18).

Issue 18's criterion: on MiniLM, ``n_steps="auto"`` at ≥ 1.0× the speed of 50 fixed nodes at ≤ their 95th-percentile
and maximum error against a 300-node float64 reference. One run, one model, the first ``--batch-size`` SST-2 dev
sentences, the predicted class as target, probabilities as the attributed output, the pad-embedding baseline for
MiniLM (as ``bench_ig.py``) and the zero baseline for the BiLSTM. Models:

* ``minilm_sst2``: all-MiniLM-L6-v2 **fine-tuned** one epoch on the SST-2 training split (``finetuned_minilm``,
  cached; the model users train);
* ``minilm``: the bundled encoder with a seeded *random* 2-class head (``build_minilm``: the speed model of
  ``bench_ig.py``, whose IG integrands are smooth because the head was never trained);
* ``reference``: the trained reference BiLSTM.

Configurations, interleaved (order rotated per round), median of ``--repeats`` after a warm-up:
``gl50`` = ``attribute(..., "integrated_gradients")`` (50 nodes, the default) and ``auto`` =
``attribute(..., n_steps="auto")`` with its defaults; ``--token-rtol`` adds ``auto`` at other token tolerances.
Accuracy: per-sentence relative L1 error Σ_t |a_t − ref_t| / Σ_t |ref_t| against Captum's
``LayerIntegratedGradients`` with 300 Gauss–Legendre steps on a float64 copy of the model (an independent
implementation), median / 95th percentile / maximum over the sentences.

Usage::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_ig_auto.py --model minilm_sst2 --batch-size 32
    .venv/bin/python benchmarks/bench_ig_auto.py --quick
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import captum_baselines as CB  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks import models as M  # noqa: E402

REFERENCE_STEPS = 300


def load(name: str, batch_size: int):
    """(model, batch, target, IG options) for ``minilm_sst2``, ``minilm`` or ``reference``."""
    if name == "reference":
        model = M.reference_model()
        batch = M.sst2_dev_batch(batch_size)
        return model, batch, M.predicted_class(model, batch), {}
    model, why = M.finetuned_minilm() if name == "minilm_sst2" else M.build_minilm()
    if model is None:
        raise SystemExit(f"MiniLM: {why}")
    batch = M.minilm_batch(model.tokenizer_for_bench, batch_size)
    return model, batch, M.predicted_class(model, batch), {"baseline": "pad"}


def errors(maps, reference) -> dict:
    out = {}
    for name, a in maps.items():
        rel = (a.double() - reference).abs().sum(1) / reference.abs().sum(1).clamp_min(1e-300)
        out[name] = {"median": float(rel.median()), "p95": float(rel.quantile(0.95)), "max": float(rel.max())}
    return out


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm_sst2", choices=["minilm_sst2", "minilm", "reference"])
    parser.add_argument(
        "--token-rtol", type=float, nargs="*", default=[], help="also time n_steps='auto' at these token tolerances"
    )
    parser.add_argument("--reference-steps", type=int, default=REFERENCE_STEPS)
    args = parser.parse_args(argv)
    threads = H.set_threads(args.threads)
    if args.quick:
        args.batch_size, args.repeats, args.reference_steps = min(args.batch_size, 2), 1, 60
    warnings.filterwarnings("ignore", message="Integrated gradients: convergence delta")
    warnings.filterwarnings("ignore", message="n_steps='auto'")
    from lightning_xai.attribution import attribute

    model, batch, target, options = load(args.model, args.batch_size)
    configs = {"gl50": {}, "auto": {"n_steps": "auto"}}
    configs.update({f"auto_token_rtol_{t:g}": {"n_steps": "auto", "token_rtol": t} for t in args.token_rtol})
    outputs = {}

    def run(name):
        def call():
            outputs[name] = attribute(
                model, batch, "integrated_gradients", target, return_n_steps=True, **options, **configs[name]
            )

        return call

    times = H.interleaved({name: run(name) for name in configs}, repeats=args.repeats, warmup=1)
    seconds = {name: H.median(t) for name, t in times.items()}
    exact = copy.deepcopy(model).double()
    reference = CB.layer_integrated_gradients(
        exact, batch, target, n_steps=args.reference_steps, internal_batch_size=256
    ).double()
    accuracy = errors({name: out[0] for name, out in outputs.items()}, reference)
    steps = {name: float(out[1].float().mean()) for name, out in outputs.items()}
    result = {
        "benchmark": "ig_auto",
        "command": H.command_line(),
        "env": H.environment(threads),
        "model": args.model,
        "model_info": getattr(model, "bench_info", {}),
        "batch": M.batch_stats(batch),
        "reference_steps": args.reference_steps,
        "seconds": {k: {"median": seconds[k], "all": times[k]} for k in seconds},
        "mean_gradient_evaluations": steps,
        "rel_l1_error": accuracy,
    }
    result["ratios"] = {
        name: {
            "speed_vs_gl50": seconds["gl50"] / seconds[name],
            "p95_error_vs_gl50": accuracy[name]["p95"] / max(accuracy["gl50"]["p95"], 1e-300),
            "max_error_vs_gl50": accuracy[name]["max"] / max(accuracy["gl50"]["max"], 1e-300),
        }
        for name in configs
        if name != "gl50"
    }
    result["met"] = {
        name: r["speed_vs_gl50"] >= 1.0 and r["p95_error_vs_gl50"] <= 1.0 and r["max_error_vs_gl50"] <= 1.0
        for name, r in result["ratios"].items()
    }
    result["markdown"] = markdown(result)
    if not args.quick:
        path = H.save(f"ig_auto_{args.model}", result, args.out)
        print(f"saved {path}")
    elif args.out:
        H.save(f"ig_auto_{args.model}", result, args.out)
    print(result["markdown"])
    return result


def markdown(r: dict) -> str:
    b = r["batch"]
    lines = [
        f"**`n_steps='auto'` vs 50 fixed nodes, model `{r['model']}`** ({r['model_info'].get('weights', '')}; "
        f"dev acc {r['model_info'].get('dev_acc', 'n/a')}), {b['sentences']} SST-2 dev sentences, T_max "
        f"{b['max_len']}; reference: Captum GL-{r['reference_steps']} on a float64 copy; {r['env']['threads']} "
        f"threads, {r['env']['utc']}, load {r['env']['loadavg_1_5_15']}.",
        "",
        f"Command: `{r['command']}`",
        "",
        "| IG | median s | gradient evaluations / sentence | rel. L1 err median | p95 | max | speed vs GL-50 | "
        "p95 err / GL-50's | max err / GL-50's | criterion met? |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, sec in r["seconds"].items():
        a, ratio = r["rel_l1_error"][name], r["ratios"].get(name)
        cells = (
            [
                f"{ratio['speed_vs_gl50']:.2f}×",
                f"{ratio['p95_error_vs_gl50']:.3g}",
                f"{ratio['max_error_vs_gl50']:.3g}",
                "yes" if r["met"][name] else "**no**",
            ]
            if ratio
            else ["1", "1", "1", "-"]
        )
        lines.append(
            f"| {name} | {sec['median']:.2f} | {r['mean_gradient_evaluations'][name]:.1f} | {a['median']:.2g} | "
            f"{a['p95']:.2g} | {a['max']:.2g} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
