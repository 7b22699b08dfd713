"""On a CUDA GPU: IG and leave-one-out throughput as a fraction of the card's forward(+backward) rate, bf16 audits.

Issue 18's GPU point, in one script sized to run in a few minutes on one card:

1. **Ceilings.** The card's dense matrix-product rate (8192³, bf16 and fp32 without TF32), as a yardstick.
2. **A trained model.** all-MiniLM-L6-v2 (the bundled encoder; ``--model-dir`` takes a copy of it) is fine-tuned
   on the full bundled SST-2 training split (6,920 sentences, batch 32) by a real Lightning ``Trainer`` on the GPU,
   ``precision="bf16-mixed"``, sdpa attention, 2 epochs. Each epoch ends with one run of each audit callback on the
   same 256 dev sentences (``budget=None``), in a rotated order, once with the default ``precision="auto"`` (the
   precision-sensitive maps in float32) and once with ``precision="trainer"`` (bf16 autocast throughout). The
   second epoch's figures are the ones reported (the first holds the CUDA start-up).
3. **Throughput** on the trained model (eval mode, 256 dev sentences as one batch), each timed with
   ``torch.cuda.synchronize`` around it, median of ``--repeats`` interleaved runs after a warm-up:

   * the *forward+backward rate*: the model's forward from embeddings plus the backward to the embeddings, on the
     256 sentences repeated ``R`` times (the layout IG runs), the best ``R`` of a sweep — padded tokens per second;
   * the *forward rate*: the same without the backward, under ``no_grad``;
   * IG with 50 Gauss–Legendre nodes (``internal_batch_size="auto"``): its gradient evaluations × padded tokens per
     second, as a fraction of the forward+backward rate;
   * leave-one-out (``mode="delete"``): its Σ L_i forward passes × their padded width per second, as a fraction of
     the forward rate (and of the forward+backward rate, the issue's yardstick);
   * each map again under ``torch.autocast("cuda", torch.bfloat16)`` — the bf16 audit — with its speed-up and its
     distance from the float32 map: relative L1 error per sentence (median, p95, max) and Kendall τ between the
     two maps (median, min).

Usage (on the device machine; ``.gpu/minilm`` holds the bundled model's files, weights stored as float16 to fit
the transfer limit and loaded back as float32)::

    python benchmarks/gpu_check.py --model-dir .gpu/minilm --out $OUT/gpu_check.json
    .venv/bin/python benchmarks/gpu_check.py --quick          # CPU smoke run of the same code
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

AUDIT_SENTENCES = 256
QUICK_SENTENCES = 4
#: IG nodes of the audits and maps (the issue's 50); the CPU smoke run (``--quick``) uses QUICK_IG_STEPS
IG_STEPS, QUICK_IG_STEPS = 50, 6


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None, help="a copy of the bundled MiniLM (default: the installed one)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: 2 training batches, 4 sentences")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--export-model",
        type=Path,
        default=None,
        metavar="DIR",
        help="only write the bundled model's files to DIR, weights as float16 (45 MB: under the "
        "device tool's 64 MiB transfer limit), and exit",
    )
    return parser.parse_args(argv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _interleaved(
    fns: Dict[str, Callable[[], Any]], device: torch.device, repeats: int, warmup: int = 1
) -> Dict[str, float]:
    """Median seconds of each function (``benchmarks.harness.interleaved``: ``warmup`` calls, then ``repeats`` rounds
    in a rotated order), each call followed by a device synchronisation so that its queued work is timed with it."""
    from benchmarks import harness as H

    def synced(fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            fn()
            _sync(device)

        return call

    _sync(device)
    times = H.interleaved({name: synced(fn) for name, fn in fns.items()}, repeats=repeats, warmup=warmup)
    return {name: H.median(t) for name, t in times.items()}


def ceilings(device: torch.device) -> Dict[str, float]:
    """Dense matrix-product TFLOP/s of the card (8192³; bf16, and fp32 with TF32 off), mean of 10 after 3."""
    if device.type != "cuda":
        return {}
    out = {}
    n = 8192
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        for _ in range(3):
            a @ b
        seconds = _timed(lambda a=a, b=b: [a @ b for _ in range(10)], device) / 10
        out[f"matmul_{name}_tflops"] = 2 * n**3 / seconds / 1e12
    torch.cuda.empty_cache()
    return out


def load_minilm(model_dir: Optional[str]):
    """(HF model in float32, tokenizer) from ``model_dir`` (see ``benchmarks.models.float32_model_dir``)."""
    from transformers import AutoTokenizer

    from benchmarks.models import float32_model_dir
    from lightning_xai.models.hf_classifier import load_hf_classifier

    model_dir = float32_model_dir(model_dir)
    torch.manual_seed(0)
    hf = load_hf_classifier(model_dir, num_labels=2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return hf, tokenizer


def fine_tune_with_audits(hf, tokenizer, device: torch.device, args) -> Dict[str, Any]:
    """Fine-tune on SST-2 with the audit callbacks; per epoch: training seconds and each audit's seconds."""
    import pytorch_lightning as pl

    from lightning_xai.callbacks import AttentionAudit, ErasureAudit
    from lightning_xai.data.hf import HFTextClassificationDataModule
    from lightning_xai.models.hf_classifier import HFClassifier

    hf.set_attn_implementation("sdpa")
    module = HFClassifier(model=hf, tokenizer=tokenizer)
    dm = HFTextClassificationDataModule(tokenizer, "sst2", batch_size=32, seed=0)
    n = QUICK_SENTENCES if args.quick else AUDIT_SENTENCES
    steps = QUICK_IG_STEPS if args.quick else IG_STEPS
    common = dict(every_n_epochs=1, num_samples=n, budget=None, on_validate=False, on_test=False)
    audits = {}
    for precision in ("auto", "trainer"):
        tag = "" if precision == "auto" else "_bf16"
        audits[f"attention_default{tag}"] = AttentionAudit(precision=precision, log_prefix=f"a{tag}", **common)
        audits[f"attention_loo{tag}"] = AttentionAudit(
            methods=("leave_one_out",), precision=precision, log_prefix=f"loo{tag}", **common
        )
        audits[f"attention_ig{tag}"] = AttentionAudit(
            methods=("integrated_gradients",),
            precision=precision,
            method_options={"integrated_gradients": {"n_steps": steps}},
            log_prefix=f"ig{tag}",
            **common,
        )
        audits[f"erasure_default{tag}"] = ErasureAudit(precision=precision, log_prefix=f"e{tag}", **common)
    names = list(audits)
    clock: Dict[str, Any] = {"train": [], "batches": [], "audit": {n: [] for n in names}}

    class Rotate(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            _sync(device)
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            _sync(device)
            clock["train"].append(time.perf_counter() - self.start)
            clock["batches"].append(trainer.num_training_batches)
            r = trainer.current_epoch % len(names)
            for name in names[r:] + names[:r]:
                clock["audit"][name].append(
                    _timed(lambda name=name: audits[name]._epoch_audit(trainer, pl_module), device)
                )

    accelerator = "gpu" if device.type == "cuda" else "cpu"
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision="bf16-mixed" if accelerator == "gpu" else "32-true",
        max_epochs=1 if args.quick else args.epochs,
        limit_train_batches=2 if args.quick else None,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*audits.values(), Rotate()],
        default_root_dir=tempfile.mkdtemp(prefix="gpu_check_"),
    )
    for audit in audits.values():
        audit.on_train_epoch_end = lambda *a, **k: None  # run from Rotate, timed
    trainer.fit(module, datamodule=dm)
    last = -1
    epoch_s = clock["train"][last]
    out: Dict[str, Any] = {
        "epochs": len(clock["train"]),
        "train_s": clock["train"],
        "batches": clock["batches"],
        "epoch_s": epoch_s,
        "audit_s": {n: clock["audit"][n] for n in names},
        "audit_share": {n: clock["audit"][n][last] / epoch_s for n in names},
        "audit_metrics": {n: _scalars(audits[n]) for n in names},
        "attn_implementation": hf.config._attn_implementation,
    }
    module.to(device).eval()
    return {"fit": out, "adapter": module.adapter}


def _scalars(audit) -> Dict[str, float]:
    if not audit.history:
        return {}
    return {k: float(v) for k, v in audit.history[-1]["metrics"].items() if isinstance(v, (int, float))}


def _dev_batch(tokenizer, n: int, device: torch.device) -> Dict[str, Any]:
    from benchmarks.models import minilm_batch

    batch = minilm_batch(tokenizer, n)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _repeat(batch: Dict[str, Any], r: int) -> Dict[str, Any]:
    return {k: v.repeat(r, *([1] * (v.dim() - 1))) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def rates(
    model, batch: Dict[str, Any], device: torch.device, repeats: int, sweep: List[int], warmup: int = 1
) -> Dict[str, Any]:
    """Padded tokens per second of forward+backward-to-embeddings and of forward alone, in float32 and under bf16
    autocast, each the best of a sweep over the batch repeated ``sweep`` times."""
    import contextlib

    from lightning_xai.attribution import explanation_context

    B, T = model.token_mask(batch).shape
    out: Dict[str, Any] = {}
    with explanation_context(model):
        for r in sweep:
            big = _repeat(batch, r)
            emb = model.embed(big).detach()
            fns = {}
            for tag in ("", "_bf16"):

                def cast(tag=tag):
                    return torch.autocast(device.type, dtype=torch.bfloat16) if tag else contextlib.nullcontext()

                def fwd_bwd(big=big, emb=emb, cast=cast):
                    with cast():
                        x = emb.clone().requires_grad_(True)
                        logits = model.forward_from_embeddings(x, big).logits
                        torch.autograd.grad(logits.float().softmax(-1)[:, 0].sum(), x)

                def fwd(big=big, emb=emb, cast=cast):
                    with torch.no_grad(), cast():
                        model.forward_from_embeddings(emb, big)

                fns["fwd_bwd" + tag], fns["fwd" + tag] = fwd_bwd, fwd
            for name, seconds in _interleaved(fns, device, repeats, warmup).items():
                out.setdefault(name, {})[r] = r * B * T / seconds
            del big, emb
    for name in list(out):
        out[f"{name}_tokens_per_s"] = max(out[name].values())
    return out


def flops_per_token(config, width: int) -> float:
    """Matrix-product FLOPs of one encoder forward per token: 2 × (4d² + 2·d·d_ff) per layer for the projections
    and the feed-forward, 4·T·d per layer for the attention scores and their use (the backward to the inputs
    costs about the same again)."""
    d, ff, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return layers * (2 * (4 * d * d + 2 * d * ff) + 4 * width * d)


def ig_accuracy(
    model,
    batch: Dict[str, Any],
    device: torch.device,
    repeats: int,
    reference_steps: int = 300,
    warmup: int = 1,
) -> Dict[str, Any]:
    """IG with 50 Gauss–Legendre nodes and ``n_steps="auto"`` (float32) against ``reference_steps`` nodes on a
    float64 copy of the model."""
    import copy
    import warnings

    from lightning_xai.attribution import attribute

    model64 = copy.deepcopy(model).double()
    out: Dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = attribute(model64, batch, "integrated_gradients", n_steps=reference_steps).double()
        maps: Dict[str, Any] = {}

        def run(name, **options):
            def fn():
                maps[name] = attribute(model, batch, "integrated_gradients", return_n_steps=True, **options)

            return fn

        seconds = _interleaved(
            {"gl50": run("gl50", n_steps=50), "auto": run("auto", n_steps="auto")}, device, repeats, warmup
        )
    del model64
    for name, (scores, steps) in maps.items():
        rel = (scores.double() - reference).abs().sum(1) / reference.abs().sum(1).clamp_min(1e-300)
        out[name] = {
            "seconds": seconds[name],
            "mean_steps": float(steps.float().mean()),
            "rel_l1_err_median": float(rel.median()),
            "rel_l1_err_p95": float(rel.quantile(0.95)),
            "rel_l1_err_max": float(rel.max()),
        }
    out["auto_speedup_vs_gl50"] = seconds["gl50"] / seconds["auto"]
    return out


def _kendall(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from lightning_xai.metrics.functional import kendall_tau

    return kendall_tau(a.float(), b.float(), mask)[0]


def maps_and_bf16(
    model,
    batch: Dict[str, Any],
    device: torch.device,
    repeats: int,
    rate: Dict[str, Any],
    ig_steps: int = IG_STEPS,
    warmup: int = 1,
) -> Dict[str, Any]:
    """Time IG-50, leave-one-out and gradient in float32 and under bf16 autocast; compare the bf16 maps."""
    from lightning_xai.attribution import attribute

    mask = model.token_mask(batch)
    B, T = mask.shape
    lengths = mask.sum(1)
    configs = {
        "integrated_gradients": dict(n_steps=ig_steps),
        "leave_one_out": {},
        "gradient": {},
    }
    results: Dict[str, Any] = {}
    maps: Dict[str, torch.Tensor] = {}

    def call(method, options, bf16):
        def run():
            if bf16:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    maps[f"{method}{'_bf16' if bf16 else ''}"] = attribute(model, batch, method, **options)
            else:
                maps[method] = attribute(model, batch, method, **options)

        return run

    fns = {}
    for method, options in configs.items():
        fns[method] = call(method, options, False)
        fns[f"{method}_bf16"] = call(method, options, True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seconds = _interleaved(fns, device, repeats, warmup)
    ig_tokens = ig_steps * B * T
    loo_passes = int(lengths.sum())
    # a deleted-token variant of row i is one token narrower than the row (special tokens included)
    width = batch["attention_mask"].sum(1) if "attention_mask" in batch else lengths
    loo_tokens = int((lengths * (width - 1)).sum())
    for method in configs:
        for tag in ("", "_bf16"):
            name = method + tag
            entry: Dict[str, Any] = {"seconds": seconds[name]}
            if method == "integrated_gradients":
                entry["padded_tokens_per_s"] = ig_tokens / seconds[name]
                entry["fraction_of_fwd_bwd_rate"] = entry["padded_tokens_per_s"] / rate[f"fwd_bwd{tag}_tokens_per_s"]
                entry["gradient_evaluations_per_s"] = ig_steps * B / seconds[name]
            if method == "leave_one_out":
                entry["forward_passes"] = loo_passes
                entry["variant_tokens_per_s"] = loo_tokens / seconds[name]
                entry["fraction_of_fwd_rate"] = entry["variant_tokens_per_s"] / rate[f"fwd{tag}_tokens_per_s"]
                entry["fraction_of_fwd_bwd_rate"] = entry["variant_tokens_per_s"] / rate[f"fwd_bwd{tag}_tokens_per_s"]
            results[name] = entry
        ref, low = maps[method].float(), maps[method + "_bf16"].float()
        rel = (low - ref).abs().sum(1) / ref.abs().sum(1).clamp_min(1e-12)
        tau = _kendall(ref, low, mask)
        results[method + "_bf16"].update(
            {
                "speedup_vs_fp32": seconds[method] / seconds[method + "_bf16"],
                "rel_l1_err_median": float(rel.median()),
                "rel_l1_err_p95": float(rel.quantile(0.95)),
                "rel_l1_err_max": float(rel.max()),
                "kendall_tau_vs_fp32_median": float(tau.nanmedian()),
                "kendall_tau_vs_fp32_min": float(tau[~tau.isnan()].min()) if bool((~tau.isnan()).any()) else None,
                "map_dtype": str(maps[method + "_bf16"].dtype),
            }
        )
    return {
        "batch": {"sentences": B, "T_max": T, "real_tokens": int(lengths.sum()), "padded_tokens": B * T},
        "maps": results,
    }


def _markdown(r: Dict[str, Any]) -> str:
    lines = [
        f"**GPU check** on {r['env'].get('gpu', 'cpu')} (torch {r['env']['torch']}, "
        f"{r['env']['when']}). Command: `{r['command']}`",
        "",
    ]
    c = r.get("ceilings", {})
    if c:
        lines.append(
            f"Card: bf16 matmul {c['matmul_bf16_tflops']:.0f} TFLOP/s, fp32 (TF32 off) "
            f"{c['matmul_fp32_tflops']:.1f} TFLOP/s (8192³)."
        )
    f = r["fit"]
    lines += [
        "",
        f"Fine-tuning (bf16-mixed, {f['attn_implementation']}): epoch {len(f['train_s'])} "
        f"{f['epoch_s']:.2f} s for {f['batches'][-1]} batches of 32.",
        "",
        "| audit (256 dev sentences) | precision | seconds | share of the epoch |",
        "|---|---|---|---|",
    ]
    for name, share in f["audit_share"].items():
        base, prec = (name[:-5], "bf16 (trainer)") if name.endswith("_bf16") else (name, "auto (fp32 maps)")
        lines.append(f"| {base} | {prec} | {f['audit_s'][name][-1]:.2f} | {share:.1%} |")
    t = r["throughput"]
    rt = r["rates"]
    lines += [
        "",
        f"Rates on the trained model ({t['batch']['sentences']} sentences, T_max {t['batch']['T_max']}; "
        "padded tokens/s, best of the batch sweep; matrix-product TFLOP/s by the count of `flops_per_token` and "
        "its share of the card's measured peak):",
        "",
        "| pass | float32 | bf16 autocast |",
        "|---|---|---|",
    ]
    for name in ("fwd_bwd", "fwd"):
        cells = []
        for tag, peak in (("", c.get("matmul_fp32_tflops")), ("_bf16", c.get("matmul_bf16_tflops"))):
            rate = rt[f"{name}{tag}_tokens_per_s"]
            tflops = rate * r["flops_per_token"] * (2 if name == "fwd_bwd" else 1) / 1e12
            cells.append(f"{rate:.3g} tok/s, {tflops:.1f} TFLOP/s" + (f" ({tflops / peak:.0%})" if peak else ""))
        lines.append(
            f"| {'forward + backward to the embeddings' if name == 'fwd_bwd' else 'forward'} | "
            f"{cells[0]} | {cells[1]} |"
        )
    lines += [
        "",
        "Maps on the same batch (the bf16 rows against the bf16 rates):",
        "",
        "| map | seconds | fraction of fwd+bwd rate | fraction of fwd rate | bf16 speed-up | bf16 rel. L1 err "
        "(median / p95 / max) | bf16 Kendall τ vs fp32 (median / min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in t["maps"].items():
        err = (
            f"{m['rel_l1_err_median']:.2g} / {m['rel_l1_err_p95']:.2g} / {m['rel_l1_err_max']:.2g}"
            if "rel_l1_err_median" in m
            else "-"
        )
        tau = (
            f"{m['kendall_tau_vs_fp32_median']:.3f} / {m['kendall_tau_vs_fp32_min']:.3f}"
            if m.get("kendall_tau_vs_fp32_min") is not None
            else "-"
        )
        frac_fb = f"{m['fraction_of_fwd_bwd_rate']:.2f}" if "fraction_of_fwd_bwd_rate" in m else "-"
        frac_f = f"{m['fraction_of_fwd_rate']:.2f}" if "fraction_of_fwd_rate" in m else "-"
        speed = f"{m['speedup_vs_fp32']:.2f}×" if "speedup_vs_fp32" in m else "-"
        lines.append(f"| {name} | {m['seconds']:.3f} | {frac_fb} | {frac_f} | {speed} | {err} | {tau} |")
    a = r.get("ig_accuracy")
    if a and "gl50" in a:
        lines += [
            "",
            "IG on the trained model against 300 Gauss–Legendre nodes on a float64 copy (float32 maps):",
            "",
            "| IG | seconds | mean gradient evaluations | rel. L1 err median | p95 | max |",
            "|---|---|---|---|---|---|",
        ]
        for name in ("gl50", "auto"):
            m = a[name]
            lines.append(
                f"| {name} | {m['seconds']:.3f} | {m['mean_steps']:.1f} | {m['rel_l1_err_median']:.2g} | "
                f"{m['rel_l1_err_p95']:.2g} | {m['rel_l1_err_max']:.2g} |"
            )
        lines.append(f"\n`n_steps='auto'` speed-up over 50 fixed nodes: {a['auto_speedup_vs_gl50']:.2f}×.")
    elif a:
        lines += ["", f"IG accuracy check failed: {a.get('error')}"]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = _parse(argv)
    if args.export_model:
        from benchmarks.models import export_minilm_float16

        print(f"wrote {export_minilm_float16(args.export_model)}")
        return {}
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    env = {
        "torch": torch.__version__,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": device.type,
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    import pytorch_lightning as pl
    import transformers

    env.update(transformers=transformers.__version__, pytorch_lightning=pl.__version__)
    result: Dict[str, Any] = {"benchmark": "gpu_check", "env": env, "command": "python " + " ".join(sys.argv)}
    started = time.perf_counter()
    result["ceilings"] = ceilings(device)
    hf, tokenizer = load_minilm(args.model_dir)
    fitted = fine_tune_with_audits(hf, tokenizer, device, args)
    result["fit"] = fitted["fit"]
    model = fitted["adapter"]
    batch = _dev_batch(tokenizer, QUICK_SENTENCES if args.quick else AUDIT_SENTENCES, device)
    sweep = [1] if args.quick else [4, 16, 50]
    repeats = 1 if args.quick else args.repeats
    warmup = 0 if args.quick else 1  # the CPU smoke run checks the code, not the timings
    result["rates"] = rates(model, batch, device, repeats, sweep, warmup)
    result["flops_per_token"] = flops_per_token(hf.config, int(model.token_mask(batch).shape[1]))
    result["throughput"] = maps_and_bf16(
        model, batch, device, repeats, result["rates"], QUICK_IG_STEPS if args.quick else IG_STEPS, warmup
    )
    try:
        result["ig_accuracy"] = ig_accuracy(model, batch, device, repeats, 60 if args.quick else 300, warmup=warmup)
    except Exception as err:  # the throughput figures above stand on their own
        result["ig_accuracy"] = {"error": repr(err)}
    result["wall_s"] = time.perf_counter() - started
    result["markdown"] = _markdown(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
    print(result["markdown"])
    return result


if __name__ == "__main__":
    main()
