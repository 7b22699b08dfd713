"""Conicity (Mohankumar et al.) and the erasure-faithfulness objective on SST-2, at what accuracy cost.

    OMP_NUM_THREADS=1 python examples/conicity_erasure_sst2.py        # ~20 min on one CPU core
    # the table in RESULTS_losses.md (each 8-epoch variant ~3-5 min CPU on one core):
    OMP_NUM_THREADS=1 python examples/conicity_erasure_sst2.py \
        --variants conicity@4 conicity@8 ortho@8 erasure@4 erasure@8 erasure:0.5@8

Models (same data, seed and width; best dev accuracy):
* base: BiLSTM + tanh attention (cached, shared with the other loss examples);
* + ConicityLoss(w = 0.5): CE + 0.5·conicity of the BiLSTM states;
* orthogonal BiLSTM (``encoder="ortho_bilstm"``);
* + ErasureFaithfulnessLoss (attention-space erasure of the soft top-20% tokens, weight 1 or as given).
On the test split: accuracy, mean conicity of the hidden states, and Serrano & Smith's decision-flip test with
the attention ranking (lightning_xai.audits.erasure.decision_flip): share of sentences whose decision flips
and the fraction of tokens removed before it does (over flipped sentences), with the random ranking alongside.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import losses_common as C  # noqa: E402

from lightning_xai.audits.erasure import decision_flip  # noqa: E402
from lightning_xai.losses import ConicityLoss, ErasureFaithfulnessLoss, conicity  # noqa: E402


def measure(model, test, flip_limit: int) -> Dict[str, float]:
    model.eval()
    correct = n = 0
    con = []
    flips = {"attention": [], "random": []}
    generator = torch.Generator().manual_seed(0)
    seen = 0
    for batch in test:
        with torch.no_grad():
            out = model(batch)
        correct += int((out.logits.argmax(-1) == batch["labels"]).sum())
        n += len(batch["labels"])
        con.append(conicity(out.hidden_states, batch["mask"]))
        if seen < flip_limit:
            for ranking in flips:
                flips[ranking].append(decision_flip(model, batch, ranking, generator=generator))
            seen += len(batch["labels"])
    result = {"acc": correct / n, "conicity": torch.cat(con).mean().item(), "flip_n": seen}
    for ranking, parts in flips.items():
        flipped = torch.cat([p.flipped for p in parts])
        frac = torch.cat([p.fraction_removed for p in parts]).double()
        result[f"{ranking}_flipped"] = flipped.double().mean().item()
        result[f"{ranking}_fraction"] = frac[flipped].mean().item() if flipped.any() else float("nan")
    return result


def parse_variant(spec: str, default_epochs: int):
    """``'erasure:0.5@8'`` -> ``('erasure', 0.5, 8)``; weight ``None`` means the variant's default."""
    head, _, epochs = spec.partition("@")
    key, _, weight = head.partition(":")
    return key, (float(weight) if weight else None), (int(epochs) if epochs else default_epochs)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["conicity", "ortho", "erasure"],
        help="'conicity', 'ortho' or 'erasure', optionally with ':<loss weight>' and/or "
        "'@<epochs>' (e.g. erasure:0.5@8); the default epochs are --epochs",
    )
    parser.add_argument(
        "--train-limit", type=int, default=None, help="train the variants on the first N training sentences only"
    )
    parser.add_argument("--flip-limit", type=int, default=512, help="test sentences for the decision-flip test")
    args = parser.parse_args(argv)
    C.setup_threads()
    dm = C.datamodule("sst2")
    test = list(C.loader(dm, "test"))
    models = {"base (BiLSTM + tanh), 8 ep": C.sst2_base(dm)}
    for spec in args.variants:
        key, weight, epochs = parse_variant(spec, args.epochs)
        if key == "conicity":
            w = 0.5 if weight is None else weight
            label, kwargs = f"+ ConicityLoss(w={w:g})", dict(objectives=[ConicityLoss(weight=w)])
        elif key == "ortho":
            label, kwargs = "orthogonal BiLSTM", dict(encoder="ortho_bilstm")
        elif key == "erasure":
            w = 1.0 if weight is None else weight
            label = f"+ ErasureFaithfulnessLoss(w={w:g})"
            kwargs = dict(objectives=[ErasureFaithfulnessLoss(fraction=0.2, weight=w)])
        else:
            raise ValueError(f"unknown variant {spec!r}; use conicity, ortho or erasure[:weight][@epochs].")
        tag = f"sst2_{key}" + ("" if weight is None else f"_w{weight:g}") + f"_ep{epochs}"
        if args.train_limit is not None:
            tag += f"_n{args.train_limit}"
        models[f"{label}, {epochs} ep"] = C.cached_classifier(
            tag, dm, epochs=epochs, attention="tanh", train_limit=args.train_limit, **kwargs
        )
    rows = []
    for label, model in models.items():
        r = measure(model, test, args.flip_limit)
        print(label, r)
        rows.append(
            [
                label,
                r["acc"],
                r["conicity"],
                r["attention_flipped"],
                r["attention_fraction"],
                r["random_flipped"],
                r["random_fraction"],
            ]
        )
    text = [
        "### Conicity, orthogonal LSTM and erasure faithfulness on SST-2",
        "",
        "BiLSTM (64/direction) + tanh attention; every model trained for the epochs in its row (best dev "
        "accuracy among them), seed 0"
        + ("" if args.train_limit is None else f", variants on the first {args.train_limit} training sentences")
        + f". Test split ({len(dm.dataset('test'))} sentences): accuracy and mean conicity; "
        f"Serrano & Smith's decision flip on the first {args.flip_limit} test sentences: share of "
        "sentences whose decision flips before one token is left, and mean fraction of tokens removed at the "
        "flip (flipped sentences), for the attention and the random ranking.",
        "",
        C.markdown_table(
            [
                "model",
                "test acc",
                "conicity",
                "flips (attention)",
                "fraction removed (attention)",
                "flips (random)",
                "fraction removed (random)",
            ],
            rows,
        ),
        "",
        "Command: `OMP_NUM_THREADS=1 python examples/conicity_erasure_sst2.py " + " ".join(argv or sys.argv[1:]) + "`",
    ]
    C.write_section("conicity_erasure_sst2", "\n".join(text))


if __name__ == "__main__":
    main()
