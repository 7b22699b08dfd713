"""How fast fixed Gauss–Legendre IG converges on MiniLM, and what that means for ``n_steps="auto"`` (issue 18).

For the first ``--sentences`` SST-2 dev sentences through the bundled all-MiniLM-L6-v2 (seeded random 2-class
head, float64 copy, pad baseline as in ``bench_ig.py``), the per-sentence relative L1 error of GL-n IG against a
``--reference``-node GL rule, for several n; and the 15-node Kronrod estimate next to its G7/K15 error estimate.
Accuracy only (no timing): it says how many gradient evaluations *any* rule needs to be as accurate as the
50 fixed nodes on this integrand.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ig_convergence_minilm.py --sentences 8 --reference 150
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/ig_convergence_minilm.py --sentences 16 --reference 150 \
        --aitken 12 14 16 --aitken 14 16 18 --aitken 12 16 20
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import save  # noqa: E402
from benchmarks.models import build_minilm, minilm_batch, predicted_class  # noqa: E402
from lightning_xai.attribution.integrated_gradients import _baseline, _ig_integrand  # noqa: E402
from lightning_xai.attribution.quadrature import gauss_kronrod_nodes, ig_nodes  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--reference", type=int, default=150)
    parser.add_argument("--steps", type=int, nargs="+", default=[15, 30, 50])
    parser.add_argument(
        "--aitken",
        type=int,
        nargs=3,
        action="append",
        default=None,
        metavar=("A", "B", "C"),
        help="also Aitken's delta-squared extrapolation of GL-A, GL-B, GL-C per token (repeatable)",
    )
    args = parser.parse_args(argv)
    model, why = build_minilm()
    if model is None:
        raise SystemExit(f"MiniLM: {why}")
    batch = minilm_batch(model.tokenizer_for_bench, args.sentences)
    model = model.double()
    target = predicted_class(model, batch)
    emb = model.embed(batch).detach().double()
    base = _baseline(model, batch, emb, "pad", None)
    mask = model.token_mask(batch)
    n_rows = emb.shape[0]

    def integrand(alphas: np.ndarray) -> torch.Tensor:
        row = torch.arange(n_rows).repeat_interleave(len(alphas))
        alpha = torch.tensor(np.tile(alphas, n_rows))
        return _ig_integrand(
            model, batch, emb, base, target, row, alpha, output="probability", create_graph=False, rows=512
        ).view(n_rows, len(alphas), -1)

    def rule(n: int) -> torch.Tensor:
        alphas, weights = ig_nodes(n)
        return torch.einsum("nkt,k->nt", integrand(alphas), torch.tensor(weights))

    ref = rule(args.reference)
    l1 = (ref.abs() * mask).sum(1)

    def stats(err: torch.Tensor) -> dict:
        return {"median": float(err.median()), "p95": float(err.quantile(0.95)), "max": float(err.max())}

    result = {"sentences": n_rows, "reference_nodes": args.reference, "gauss_legendre": {}}
    for n in args.steps:
        result["gauss_legendre"][n] = stats(((rule(n) - ref).abs() * mask).sum(1) / l1)
    alphas, kw, gw = gauss_kronrod_nodes()
    values = integrand(alphas)
    kron = torch.einsum("nkt,k->nt", values, torch.tensor(kw))
    gauss = torch.einsum("nkt,k->nt", values, torch.tensor(gw))
    result["kronrod15"] = {
        "error": stats(((kron - ref).abs() * mask).sum(1) / l1),
        "max_token_error": stats(((kron - ref).abs() * mask).amax(1) / l1),
        "max_token_estimate": stats(((kron - gauss).abs() * mask).amax(1) / l1),
    }
    # Aitken's Δ² per token over three rules: exact if each token's error were c·r^n (A + B + C gradient evaluations)
    for a, b, c in args.aitken or []:
        ia, ib, ic = rule(a), rule(b), rule(c)
        d1, d2 = ib - ia, ic - ib
        den = d2 - d1
        safe = den.abs() > 1e-300
        extrapolated = torch.where(safe, ic - d2 * d2 / torch.where(safe, den, torch.ones_like(den)), ic)
        result.setdefault("aitken", {})[f"{a}/{b}/{c}"] = stats(((extrapolated - ref).abs() * mask).sum(1) / l1)
    save("ig_convergence_minilm", result)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
