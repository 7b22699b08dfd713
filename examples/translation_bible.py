"""Greek → English translation on the bundled alignment corpus: how well do a small Transformer's cross-attention
and saliency maps align words, against human alignments and a statistical aligner?

A word-level Marian encoder–decoder (examples/translation_model.py) is trained from scratch on the train split
with a real ``pl.Trainer`` on CPU (weights cached under examples/.cache/), then every test verse (Mark) is
explained by each method of examples/translation_saliency.py and each target word is linked to its
highest-scoring source word (``extract_links(..., "target_argmax")``, Ding, Xu & Koehn 2019; target tokens the
annotators excluded get no link). AER is the corpus-level alignment error rate.

* **force decoding**: the reference translation is fed to the decoder; links are scored against the human links.
* **free decoding**: the model's own greedy translation is explained; the human links are over the reference
  words, so they do not apply. As Ding et al. do for free decoding, links are compared with a statistical
  aligner's links of the same (source, output) pairs: IBM Model 1, grow-diag-final-and, trained on the corpus plus
  the outputs. Output tokens without a letter or digit (punctuation) are left out, like the corpus's exclusions.

The best head of each layer is chosen on the val split (force decoding) and scored on test.

    python examples/translation_bible.py [--test-verses N] [--heavy-verses 100] [--smooth-samples 10] [--ig-steps 16]
                                         [--eflomal] [--json out.json]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import translation_saliency as saliency  # noqa: E402
from ibm_model1 import align_corpus, eflomal_corpus  # noqa: E402
from translation_model import (
    CACHE,
    EOS,
    ModelSettings,
    encode,
    evaluate_force_decoding,  # noqa: E402
    train_or_load,
)

from lightning_xai.data import AlignedVerse, read_alignments  # noqa: E402
from lightning_xai.metrics.functional import alignment_scores, extract_links  # noqa: E402


def corpus_bleu(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[str]], n: int = 4) -> float:
    """Corpus BLEU-4 (Papineni et al. 2002: clipped n-gram precisions, geometric mean, brevity penalty), 0–100."""
    matches, totals = [0] * n, [0] * n
    hyp_len = ref_len = 0
    for hyp, ref in zip(hypotheses, references):
        hyp_len, ref_len = hyp_len + len(hyp), ref_len + len(ref)
        for k in range(1, n + 1):
            h = Counter(tuple(hyp[i : i + k]) for i in range(len(hyp) - k + 1))
            r = Counter(tuple(ref[i : i + k]) for i in range(len(ref) - k + 1))
            matches[k - 1] += sum(min(c, r[g]) for g, c in h.items())
            totals[k - 1] += max(len(hyp) - k + 1, 0)
    if min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / n
    brevity = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / max(hyp_len, 1))
    return 100 * brevity * math.exp(log_precision)


def _is_word(token: str) -> bool:
    return any(ch.isalnum() for ch in token)


GRADIENT = "gradient (L2)"
GRAD_X_INPUT = "grad×input (absolute)"


def method_maps(
    model, source_ids, target_ids, smooth_samples: int, ig_steps: int, heavy: bool
) -> Dict[str, torch.Tensor]:
    """Every method's ``[S, T]`` map of one verse; attention methods per layer (mean of heads) and per head.
    ``heavy``: also SmoothGrad, smoothed attention and integrated gradients (many passes per verse)."""
    maps: Dict[str, torch.Tensor] = {}
    attention = saliency.cross_attention(model, source_ids, target_ids)  # [L, H, S, T]
    shifted = saliency.cross_attention(model, source_ids, target_ids + [EOS], shift=1)
    for layer in range(attention.shape[0]):
        maps[f"cross-attention, layer {layer + 1}, mean of heads"] = attention[layer].mean(0)
        for head in range(attention.shape[1]):
            maps[f"head {layer + 1}.{head + 1}"] = attention[layer, head]
    maps["cross-attention, mean of all layers and heads"] = attention.mean((0, 1))
    for layer in range(attention.shape[0]):
        maps[f"Shift-Att (Chen et al. 2020), layer {layer + 1}, mean of heads"] = shifted[layer].mean(0)
    maps[GRADIENT], maps[GRAD_X_INPUT] = saliency.gradient_and_grad_x_input(model, source_ids, target_ids)
    if heavy:
        smooth_grad, smooth_attention = saliency.smooth_grad_and_attention(
            model, source_ids, target_ids, n_samples=smooth_samples
        )
        for layer in range(attention.shape[0]):
            maps[f"smoothed attention ({smooth_samples} samples), layer {layer + 1}, mean of heads"] = smooth_attention[
                layer
            ].mean(0)
        maps[f"SmoothGrad ({smooth_samples} samples, L2)"] = smooth_grad
        maps[f"integrated gradients ({ig_steps} steps, zero baseline)"] = saliency.integrated_gradients(
            model, source_ids, target_ids, n_steps=ig_steps
        )
    return maps


def links_by_method(
    model,
    verses: Sequence[AlignedVerse],
    encoded: Sequence,
    smooth_samples: int,
    ig_steps: int,
    heavy_verses: int,
    progress: Optional[Callable[[int], None]] = None,
) -> Dict[str, List[torch.Tensor]]:
    """Target-argmax links of every method for every verse (``encoded``: (source ids, target ids) pairs); the
    heavy methods for the first ``heavy_verses`` verses only."""
    links: Dict[str, List[torch.Tensor]] = {}
    for i, (verse, (source_ids, target_ids)) in enumerate(zip(verses, encoded)):
        maps = method_maps(model, source_ids, target_ids, smooth_samples, ig_steps, heavy=i < heavy_verses)
        for name, scores in maps.items():
            links.setdefault(name, []).append(
                extract_links(scores.float(), "target_argmax", target_exclude=verse.target_exclude)
            )
        if progress:
            progress(i)
    return links


def aer_table(links: Dict[str, List], gold: Sequence, verses: Optional[int] = None) -> Dict[str, Dict[str, float]]:
    """Scores of the methods with links for the first ``verses`` verses (all: those with a link list per verse)."""
    n = len(gold) if verses is None else verses
    return {
        name: {k: float(v) for k, v in alignment_scores(pred[:n], gold[:n]).items()}
        for name, pred in links.items()
        if len(pred) >= n
    }


def _with_best_heads(links: Dict[str, List], best_heads: Dict[int, str]) -> Dict[str, List]:
    kept = {n: v for n, v in links.items() if not n.startswith("head ")}
    for layer, head in best_heads.items():
        kept[f"cross-attention, layer {layer}, best head on val ({head.split()[1]})"] = links[head]
    return dict(sorted(kept.items(), key=lambda item: _order(item[0])))


def _order(name: str) -> tuple:
    for rank, prefix in enumerate(
        (
            "cross-attention, layer",
            "cross-attention, mean",
            "Shift-Att",
            "smoothed",
            "gradient",
            "grad×input",
            "SmoothGrad",
            "integrated",
            "IBM",
            "eflomal",
        )
    ):
        if name.startswith(prefix):
            return rank, name
    return 99, name


def best_heads_on_val(model, verses: Sequence[AlignedVerse], encoded: Sequence) -> Tuple[Dict[int, str], Dict]:
    """Each decoder layer's head with the lowest val AER (force decoding), and every head's val AER."""
    links: Dict[str, List[torch.Tensor]] = {}
    for verse, (source_ids, target_ids) in zip(verses, encoded):
        attention = saliency.cross_attention(model, source_ids, target_ids)
        for layer in range(attention.shape[0]):
            for head in range(attention.shape[1]):
                links.setdefault(f"head {layer + 1}.{head + 1}", []).append(
                    extract_links(attention[layer, head], "target_argmax", target_exclude=verse.target_exclude)
                )
    aer = {name: scores["aer"] for name, scores in aer_table(links, [v.sure for v in verses]).items()}
    layers = model.config.decoder_layers
    return {
        layer: min((n for n in aer if n.startswith(f"head {layer}.")), key=aer.get) for layer in range(1, layers + 1)
    }, aer


def run(
    settings: Optional[ModelSettings] = None,
    *,
    test_verses: Optional[int] = None,
    val_verses: Optional[int] = None,
    heavy_verses: int = 100,
    smooth_samples: int = 10,
    ig_steps: int = 16,
    eflomal: bool = False,
    cache: Optional[Path] = CACHE,
    log: Callable[[str], None] = print,
) -> Dict:
    """Train (or load) the model and score every method; returns the figures as a dict (see :func:`report`).

    ``out["force"]`` / ``out["free"]``: the cheap methods and baselines on all ``test_verses`` test verses;
    ``out["force_subset"]`` / ``out["free_subset"]``: every method on the first ``heavy_verses`` of them.
    """
    settings = settings or ModelSettings()
    start = time.time()
    splits = {s: read_alignments(s) for s in ("train", "val", "test")}
    val, test = splits["val"][:val_verses], splits["test"][:test_verses]
    heavy_verses = min(heavy_verses, len(test))
    model, source_vocab, target_vocab, cached = train_or_load(settings, splits["train"], splits["val"], cache, log)
    trained = time.time()
    log(f"model {'loaded from cache' if cached else 'trained'} in {trained - start:.0f} s")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    val_enc = [encode(v, source_vocab, target_vocab) for v in val]
    test_enc = [encode(v, source_vocab, target_vocab) for v in test]
    out: Dict = {
        "settings": settings.__dict__,
        "cached": cached,
        "test_verses": len(test),
        "val_verses": len(val),
        "heavy_verses": heavy_verses,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": {"source": len(source_vocab), "target": len(target_vocab)},
        "smooth_samples": smooth_samples,
        "ig_steps": ig_steps,
    }
    out["force_decoding"] = {
        "val": evaluate_force_decoding(model, val_enc),
        "test": evaluate_force_decoding(model, test_enc),
    }
    hypotheses = saliency.greedy_decode(model, [s for s, _ in test_enc])
    hyp_words = [target_vocab.decode(h) for h in hypotheses]
    out["test_bleu_greedy"] = corpus_bleu(hyp_words, [[w.lower() for w in v.target] for v in test])
    log(f"force decoding {out['force_decoding']}, greedy BLEU {out['test_bleu_greedy']:.2f}")
    best_heads, out["val_head_aer"] = best_heads_on_val(model, val, val_enc)
    out["best_heads"] = best_heads

    step = max(1, len(test) // 5)
    force = links_by_method(
        model,
        test,
        test_enc,
        smooth_samples,
        ig_steps,
        heavy_verses,
        lambda i: (i + 1) % step == 0 and log(f"force decoding: {i + 1}/{len(test)} verses"),
    )
    explained = time.time()
    # the statistical aligner is trained on the sentences of the corpus the model was trained on, plus val and test
    train = splits["train"][: settings.train_verses] if settings.train_verses else splits["train"]
    corpus = train + splits["val"] + splits["test"]
    force["IBM Model 1, 5 EM iterations, grow-diag-final-and"] = [sorted(x) for x in align_corpus(test, corpus)]
    if eflomal:
        force["eflomal, grow-diag-final-and"] = [sorted(x) for x in eflomal_corpus(test, corpus)]
    force = _with_best_heads(force, best_heads)
    gold = [v.sure for v in test]
    out["force"], out["force_subset"] = aer_table(force, gold), aer_table(force, gold, heavy_verses)

    # free decoding: explain the greedy outputs; reference links from Model 1 on (source, output)
    free_verses = [
        AlignedVerse(v.verse, v.source, words, [0 if _is_word(w) else 1 for w in words], [])
        for v, words in zip(test, hyp_words)
    ]
    free_enc = [(s, h) for (s, _), h in zip(test_enc, hypotheses)]
    model1_free = [sorted(x) for x in align_corpus(free_verses, corpus + free_verses)]
    free = links_by_method(
        model,
        free_verses,
        free_enc,
        smooth_samples,
        ig_steps,
        heavy_verses,
        lambda i: (i + 1) % step == 0 and log(f"free decoding: {i + 1}/{len(test)} verses"),
    )
    free = _with_best_heads(free, best_heads)
    out["free"], out["free_subset"] = aer_table(free, model1_free), aer_table(free, model1_free, heavy_verses)
    out["examples"] = [{"reference": " ".join(v.target), "greedy": " ".join(h)} for v, h in zip(test[:3], hyp_words)]
    out["seconds"] = {
        "train_or_load": trained - start,
        "force_explanations": explained - trained,
        "total": time.time() - start,
    }
    return out


def report(out: Dict, subset: bool = False) -> str:
    """An AER table in Markdown (force: against human links; free: against IBM Model 1 on the greedy outputs)."""
    force, free = (out["force_subset"], out["free_subset"]) if subset else (out["force"], out["free"])
    lines = ["| method | force AER | precision | recall | free: AER vs Model 1 |", "|---|---|---|---|---|"]
    for name, scores in force.items():
        other = free.get(name)
        lines.append(
            f"| {name} | {scores['aer']:.3f} | {scores['precision']:.3f} | {scores['recall']:.3f} | "
            + (f"{other['aer']:.3f} |" if other else "— |")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--test-verses", type=int, default=None, help="the first N test verses (default: all 673)")
    parser.add_argument(
        "--heavy-verses",
        type=int,
        default=100,
        help="SmoothGrad, smoothed attention and IG on the first N test verses (default 100)",
    )
    parser.add_argument("--smooth-samples", type=int, default=10)
    parser.add_argument("--ig-steps", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=ModelSettings.epochs)
    parser.add_argument("--eflomal", action="store_true", help="also run the eflomal baseline (pip install eflomal)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: on a shared CPU, more threads mostly spin)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = run(
        ModelSettings(epochs=args.epochs),
        test_verses=args.test_verses,
        heavy_verses=args.heavy_verses,
        smooth_samples=args.smooth_samples,
        ig_steps=args.ig_steps,
        eflomal=args.eflomal,
    )
    print(
        f"\n{out['parameters']:,} parameters, vocab {out['vocab']}, {out['test_verses']} test verses; "
        f"force decoding {out['force_decoding']}; greedy BLEU {out['test_bleu_greedy']:.2f}; "
        f"best heads on val {out['best_heads']}; seconds {out['seconds']}\n"
    )
    print(f"All {out['test_verses']} test verses:\n")
    print(report(out))
    print(f"\nThe first {out['heavy_verses']} test verses, every method:\n")
    print(report(out, subset=True))
    if args.json:
        import json

        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
