"""gradient, grad×input and SmoothGrad: lightning_xai vs Captum Saliency / InputXGradient / NoiseTunnel.

Same model, batch (SST-2 dev, first 256 sentences), target (predicted class) and output (probability).

* ``gradient``: ours ``reduction="l2"`` vs Captum ``Saliency(abs=False)`` reduced by the L2 norm over E.
* ``grad_x_input``: ours vs Captum ``InputXGradient`` summed over E.
* ``smooth_grad``: ours (30 samples, σ = 0.15·(max − min) per sentence, noise on real tokens, mean of the
  per-sample maps) vs Captum ``NoiseTunnel(Saliency)`` smoothgrad with 30 samples and the batch-mean σ
  (Captum takes one σ per input tensor, averages gradients, then we reduce by L2) — equal work. Numerical
  agreement at the same settings is checked by feeding *the same noise* to both: ours via ``noise=``, Captum
  by running ``Saliency`` on each noisy copy and averaging the per-sample L2 maps.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_gradients.py --model reference``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks import captum_baselines as CB  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks import models as M  # noqa: E402


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.add_argument("--model", default="reference", choices=["reference", "unpacked", "minilm"])
    parser.add_argument(
        "--weights",
        default="trained",
        choices=["trained", "random"],
        help="reference weights trained 2 epochs on SST-2 (cached) or seeded random",
    )
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args(argv)
    threads = H.set_threads(args.threads)
    if args.quick:
        args.batch_size, args.repeats, args.samples = min(args.batch_size, 8), 2, 4
    from lightning_xai.attribution import attribute

    model, batch, target = M.model_batch_target(args.model, args.batch_size, args.weights)
    mask = model.token_mask(batch)
    with torch.no_grad():
        emb = model.embed(batch)
    real = mask.unsqueeze(-1)
    sigma = 0.15 * (
        emb.masked_fill(~real, float("-inf")).amax((1, 2)) - emb.masked_fill(~real, float("inf")).amin((1, 2))
    )
    stdev = float(sigma.mean())
    S = args.samples
    pairs = {
        "gradient": (
            lambda: attribute(model, batch, "gradient", target),
            lambda: CB.saliency(model, batch, target, "l2"),
        ),
        "grad_x_input": (
            lambda: attribute(model, batch, "grad_x_input", target),
            lambda: CB.input_x_gradient(model, batch, target),
        ),
        "smooth_grad": (
            lambda: attribute(model, batch, "smooth_grad", target, n_samples=S),
            lambda: CB.noise_tunnel_saliency(model, batch, target, stdevs=stdev, nt_samples=S),
        ),
    }
    fns = {}
    for name, (ours, theirs) in pairs.items():
        fns[f"ours_{name}"], fns[f"captum_{name}"] = ours, theirs
    result = {
        "benchmark": "gradients",
        "command": H.command_line(),
        "env": H.environment(threads),
        "model": args.model,
        "model_info": getattr(model, "bench_info", {}),
        "batch": M.batch_stats(batch),
        "smooth_grad_samples": S,
        "captum_stdev": stdev,
    }
    times = H.interleaved(fns, repeats=args.repeats, warmup=1)
    med = {k: H.median(v) for k, v in times.items()}
    result["seconds"] = {k: {"median": med[k], "all": v} for k, v in times.items()}
    result["ratios"] = {name: med[f"captum_{name}"] / med[f"ours_{name}"] for name in pairs}

    # numerical agreement at the same settings
    agree = {
        "gradient": float((pairs["gradient"][0]() - pairs["gradient"][1]()).abs().max()),
        "grad_x_input": float((pairs["grad_x_input"][0]() - pairs["grad_x_input"][1]()).abs().max()),
    }
    ours_abs = attribute(model, batch, "gradient", target, reduction="abs_sum")
    agree["gradient_abs_sum"] = float((ours_abs - CB.saliency(model, batch, target, "abs_sum")).abs().max())
    k = min(S, 8)
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn((k, *emb.shape), generator=gen) * sigma.view(1, -1, 1, 1) * real
    ours_sg = attribute(model, batch, "smooth_grad", target, n_samples=k, noise=noise)
    captum_sg = torch.stack([CB.saliency_on(model, batch, target, emb + noise[i]) for i in range(k)]).mean(0)
    agree["smooth_grad_same_noise"] = float((ours_sg - captum_sg).abs().max())
    scale = {name: float(pairs[name][1]().abs().max()) for name in ("gradient", "grad_x_input")}
    result["agreement_max_abs"] = agree
    result["captum_max_abs_value"] = scale
    result["markdown"] = markdown(result)
    path = H.save(f"gradients_{args.model}", result, args.out)
    print(result["markdown"])
    print(f"\nsaved {path}")
    return result


def markdown(r: dict) -> str:
    b = r["batch"]
    med = {k: v["median"] for k, v in r["seconds"].items()}
    lines = [
        f"**gradient / grad×input / SmoothGrad, model `{r['model']}`**, batch {b['sentences']} sentences, "
        f"T_max {b['max_len']}; SmoothGrad {r['smooth_grad_samples']} samples; {r['env']['threads']} threads, "
        f"{r['env']['utc']}, load {r['env']['loadavg_1_5_15']}.",
        "",
        f"Command: `{r['command']}`",
        "",
    ]
    rows = [
        (
            name,
            med[f"ours_{name}"],
            med[f"captum_{name}"],
            r["ratios"][name],
            r["agreement_max_abs"].get(name if name != "smooth_grad" else "smooth_grad_same_noise"),
        )
        for name in ("gradient", "grad_x_input", "smooth_grad")
    ]
    lines.append(
        H.table(
            rows, ("method", "ours median s", "Captum median s", "speed-up (Captum/ours)", "max abs diff vs Captum")
        )
    )
    lines += [
        "",
        f"Max abs diff, gradient with |·|-sum reduction: {r['agreement_max_abs']['gradient_abs_sum']:.2e}. "
        "SmoothGrad agreement uses the same noise tensor for both; its timing row compares ours with "
        "Captum NoiseTunnel(Saliency) at equal samples.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
