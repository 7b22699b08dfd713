"""Issue 19: one line in an existing Lightning training.

A user's own LightningModule wrapping ``AutoModelForSequenceClassification`` (sdpa attention), a DataModule that
holds the tokenizer, plain Hugging Face batch dicts, ``callbacks=[AttentionAudit()]`` and nothing else, in real
Trainers of both Lightning packages: the audit finds the model and the tokenizer by itself, logs its agreement
metrics, shows word pieces, and leaves training exactly as it was (sdpa in every step, bit-identical weights,
the same checkpoint keys, a checkpoint that loads into a plain transformers model).
"""

from __future__ import annotations

import collections
import csv
import glob
import os
import re

import lightning.pytorch
import pytest
import pytorch_lightning
import torch
from transformers import AutoModelForSequenceClassification, BertConfig, BertTokenizerFast, DataCollatorWithPadding

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.data import read_split
from lightning_xai.reporting import wandb_payload

PACKAGES = {"lightning.pytorch": lightning.pytorch, "pytorch_lightning": pytorch_lightning}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def sst2_tokenizer(tmp_path) -> BertTokenizerFast:
    """A real WordPiece tokenizer whose vocabulary is the 600 most frequent words of the bundled SST-2 train split."""
    counts = collections.Counter(t.lower() for e in read_split("sst2", "train")[:2000] for t in e.tokens)
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(SPECIALS + [w for w, _ in counts.most_common(600)]) + "\n")
    return BertTokenizerFast(vocab=str(path), do_lower_case=True)


def user_classes(pkg):
    """The user's code, written against ``pkg`` only: nothing of lightning_xai in it."""

    class SST2(pkg.LightningDataModule):
        def __init__(self, tokenizer) -> None:
            super().__init__()
            self.tokenizer = tokenizer

        def _loader(self, split: str, n: int, shuffle: bool):
            rows = [
                dict(self.tokenizer(" ".join(e.tokens), truncation=True, max_length=48), labels=e.label, sentence_id=i)
                for i, e in enumerate(read_split("sst2", split)[:n])
            ]
            return torch.utils.data.DataLoader(
                rows, batch_size=16, shuffle=shuffle, collate_fn=DataCollatorWithPadding(self.tokenizer)
            )

        def train_dataloader(self):
            return self._loader("train", 64, shuffle=True)

        def val_dataloader(self):
            return self._loader("val", 32, shuffle=False)

    class Classifier(pkg.LightningModule):
        def __init__(self, vocab_size: int) -> None:
            super().__init__()
            config = BertConfig(
                vocab_size=vocab_size,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
                num_labels=2,
            )
            self.model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
            self.step_implementations = []

        def forward(self, batch):
            keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
            return self.model(**{k: batch[k] for k in keys if k in batch})

        def training_step(self, batch, batch_idx):
            self.step_implementations.append(self.model.config._attn_implementation)
            return self(batch).loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self(batch).loss, batch_size=len(batch["labels"]))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return SST2, Classifier


def fit(pkg, tokenizer, root, callbacks):
    SST2, Classifier = user_classes(pkg)
    pkg.seed_everything(0, verbose=False)
    module, data = Classifier(len(tokenizer)), SST2(tokenizer)
    trainer = pkg.Trainer(
        max_epochs=2,
        default_root_dir=str(root),
        logger=pkg.loggers.CSVLogger(str(root)),
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        deterministic=True,
    )
    trainer.fit(module, datamodule=data)
    (checkpoint,) = glob.glob(os.path.join(str(root), "**", "*.ckpt"), recursive=True)
    return trainer, module, torch.load(checkpoint, weights_only=True)  # plain tensors and lists only


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_attention_audit_on_an_unmodified_user_module(package, tmp_path):
    pkg, tokenizer = PACKAGES[package], sst2_tokenizer(tmp_path)
    audit = AttentionAudit(num_samples=16)
    trainer, module, checkpoint = fit(pkg, tokenizer, tmp_path / "audited", [audit])
    _, reference, reference_checkpoint = fit(pkg, tokenizer, tmp_path / "plain", [])

    # the audit ran at every epoch and its agreement metrics reached the logger
    assert [r["epoch"] for r in audit.history] == [0, 1]
    key = "kendall_tau/attention_vs_gradient/mean"
    assert key in audit.history[-1]["metrics"]
    with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as handle:
        logged = [row for row in csv.DictReader(handle) if row.get(f"attention_audit/{key}")]
    assert len(logged) == 2 and all(-1 <= float(r[f"attention_audit/{key}"]) <= 1 for r in logged)

    # word pieces (from the DataModule's tokenizer) in the example table, special tokens left out
    examples = audit.latest.examples
    for example in examples:
        example.tokens = audit.example_tokens(trainer, module, example)
    first = examples[0]
    assert first.tokens == tokenizer.convert_ids_to_tokens(first.token_ids)
    assert not {"[CLS]", "[SEP]", "[PAD]"} & {t for e in examples for t in e.tokens}
    wandb = pytest.importorskip("wandb")
    table = wandb_payload("attention_audit", examples, wandb)["attention_audit/examples"]
    row = dict(zip(table.columns, table.data[0]))
    assert row["tokens"] == " ".join(first.tokens) and any(t.isalpha() for t in first.tokens)

    # training untouched: sdpa in every step, bit-identical weights, the same checkpoint keys
    assert module.step_implementations == ["sdpa"] * 8 == reference.step_implementations
    assert module.model.config._attn_implementation == "sdpa"
    mine, theirs = module.state_dict(), reference.state_dict()
    assert list(mine) == list(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert list(checkpoint["state_dict"]) == list(reference_checkpoint["state_dict"]) == list(mine)
    # ... and the checkpoint loads into a plain transformers model, in code that never heard of lightning_xai
    plain = AutoModelForSequenceClassification.from_config(module.model.config)
    plain.load_state_dict({k[len("model.") :]: v for k, v in checkpoint["state_dict"].items()})


class MaskedSoftmax(torch.nn.Module):
    def forward(self, scores, mask):
        return scores.masked_fill(~mask, float("-inf")).softmax(-1)


class GRUAttention(torch.nn.Module):
    """A user's own network: nothing of lightning_xai in it."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, 16)
        self.rnn = torch.nn.GRU(16, 16, batch_first=True)
        self.score = torch.nn.Linear(16, 1)
        self.attn = MaskedSoftmax()
        self.out = torch.nn.Linear(16, 2)

    def forward(self, ids, mask):
        hidden, _ = self.rnn(self.emb(ids))
        weights = self.attn(self.score(hidden).squeeze(-1), mask)
        return self.out(torch.einsum("bt,bth->bh", weights, hidden))


def test_a_custom_network_named_by_a_callable(kit, tmp_path):
    from lightning_xai.adapters import HookAdapter

    class Classifier(pytorch_lightning.LightningModule):
        def __init__(self, vocab_size: int) -> None:
            super().__init__()
            self.net = GRUAttention(vocab_size)

        def training_step(self, batch, batch_idx):
            logits = self.net(batch["input_ids"], batch["mask"])
            return torch.nn.functional.cross_entropy(logits, batch["labels"])

        def validation_step(self, batch, batch_idx):
            pass

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    built = []

    def explain(module):
        built.append(module)
        return HookAdapter(
            module.net,
            embedding="emb",
            attention="attn",
            forward_fn=lambda net, batch: net(batch["input_ids"], batch["mask"]),
        )

    dm = kit.make_dm(train=64, val=32)
    pytorch_lightning.seed_everything(0, verbose=False)
    module = Classifier(dm.vocab_size)
    keys = list(module.state_dict())
    audit = AttentionAudit(model=explain, num_samples=16)
    trainer = kit.make_trainer(tmp_path, [audit], max_epochs=2)
    trainer.fit(module, dm)
    assert [r["epoch"] for r in audit.history] == [0, 1]
    assert -1 <= audit.history[-1]["metrics"]["kendall_tau/attention_vs_gradient/mean"] <= 1
    assert len(built) == 1 and built[0] is module  # one adapter per module, built once
    assert list(module.state_dict()) == keys  # the adapter is not registered in the module
    example = audit.latest.examples[0]
    assert audit.example_tokens(trainer, module, example) == dm.tokens("val", example.index)


def test_which_model_is_found_and_how_to_name_it(tmp_path):
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    from lightning_xai.adapters import HuggingFaceAdapter
    from lightning_xai.models import AttentionClassifier

    config = BertConfig(
        vocab_size=40,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=8,
        max_position_embeddings=16,
    )

    class Two(pytorch_lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.student = AutoModelForSequenceClassification.from_config(config)
            self.teacher = torch.nn.ModuleDict({"net": AutoModelForSequenceClassification.from_config(config)})

    two = Two()
    with pytest.raises(
        MisconfigurationException,
        match=r"several .*student \(BertForSequenceClassification\), "
        r"teacher\.net .*model='<attribute path>'",
    ):
        AttentionAudit().explainable(two)
    assert AttentionAudit(model="teacher.net").explainable(two).model is two.teacher["net"]
    audit = AttentionAudit(model="student")
    assert audit.explainable(two) is audit.explainable(two)  # cached in the callback
    with pytest.raises(MisconfigurationException, match="missing: embed.*holds no explainable submodule"):
        AttentionAudit().explainable(pytorch_lightning.LightningModule())
    with pytest.raises(MisconfigurationException, match=r"AttentionAudit\(model\) must be"):
        AttentionAudit(model=3)

    class Holder(pytorch_lightning.LightningModule):  # an explainable submodule is found as it is
        def __init__(self) -> None:
            super().__init__()
            self.classifier = AttentionClassifier(vocab_size=10, num_classes=2)
            self.adapter = None

    holder = Holder()
    assert AttentionAudit().explainable(holder) is holder.classifier
    holder.classifier = HuggingFaceAdapter(AutoModelForSequenceClassification.from_config(config))
    assert AttentionAudit().explainable(holder) is holder.classifier  # the classifier inside counts once


def test_losses_take_the_module_that_holds_the_model(tmp_path):
    from lightning_xai.adapters import explainable_model
    from lightning_xai.losses import AttentionAlignmentLoss, ErasureFaithfulnessLoss

    tokenizer = sst2_tokenizer(tmp_path)
    _, Classifier = user_classes(pytorch_lightning)
    torch.manual_seed(0)
    module = Classifier(len(tokenizer)).eval()  # no dropout: the two calls below are comparable
    module.tokenizer = tokenizer
    keys = list(module.state_dict())
    texts = [" ".join(e.tokens) for e in read_split("sst2", "val")[:4]]
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))  # no 'mask': derived from the tokenizer
    adapter = explainable_model(module)  # what the module's own training_step would call
    assert adapter.tokenizer is tokenizer and adapter is explainable_model(module)
    outputs = adapter(batch)
    for loss in (ErasureFaithfulnessLoss(), AttentionAlignmentLoss("gradient")):
        torch.testing.assert_close(loss(outputs, batch, model=module), loss(outputs, batch, model=adapter))
    assert list(module.state_dict()) == keys
    special = torch.isin(batch["input_ids"], torch.tensor(tokenizer.all_special_ids))
    assert not adapter.token_mask(batch)[special].any()


def test_the_adversary_takes_the_module_that_holds_its_base(tmp_path):
    from lightning_xai.losses import ModelConsistentAdversary

    _, Classifier = user_classes(pytorch_lightning)
    torch.manual_seed(0)
    base = Classifier(40)
    keys = list(base.state_dict())
    objective = ModelConsistentAdversary(base, weight=0.1)
    assert objective._base[0].model is base.model and list(base.state_dict()) == keys
    assert not any(p.requires_grad for p in base.model.parameters())  # frozen, as an explainable base is


def test_report_html_shows_the_word_pieces_in_a_lightning_pytorch_trainer(tmp_path):
    import html

    from lightning_xai.reporting import AuditReport

    tokenizer = sst2_tokenizer(tmp_path)
    audit, report = (
        AttentionAudit(num_samples=8),
        AuditReport(dirpath=str(tmp_path / "report"), png=False, heatmap_pngs=0, max_examples=2),
    )
    SST2, Classifier = user_classes(lightning.pytorch)
    lightning.pytorch.seed_everything(0, verbose=False)
    trainer = lightning.pytorch.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        callbacks=[audit, report],
    )
    trainer.fit(Classifier(len(tokenizer)), datamodule=SST2(tokenizer))
    page = open(report.report_path, encoding="utf-8").read()
    shown = " ".join(html.unescape(t) for t in re.findall(r'<span class="tok"[^>]*>([^<]*)</span>', page))
    first = audit.latest.examples[0]
    assert first.tokens == tokenizer.convert_ids_to_tokens(first.token_ids)
    assert " ".join(first.tokens) in shown and not any(t.isdigit() for t in first.tokens)  # pieces, not ids


def test_impermissible_monitor_reads_plain_hugging_face_batches(tmp_path):
    """Batches with ``impermissible`` but no ``mask`` key (a plain ``DataCollatorWithPadding`` batch): the monitor's
    check compared with ``batch['mask']`` and raised ``KeyError: 'mask'`` before its first audit."""
    from lightning_xai.callbacks import ImpermissibleAttentionMonitor

    pkg, tokenizer = pytorch_lightning, sst2_tokenizer(tmp_path)
    SST2, Classifier = user_classes(pkg)

    class Marked(SST2):
        def _loader(self, split, n, shuffle):
            loader = super()._loader(split, n, shuffle)
            pad = loader.collate_fn

            def collate(rows):
                batch = pad(rows)
                batch["impermissible"] = batch["input_ids"] == tokenizer.convert_tokens_to_ids("the")
                return batch

            return torch.utils.data.DataLoader(loader.dataset, batch_size=16, collate_fn=collate)

    monitor = ImpermissibleAttentionMonitor(num_samples=16, budget=None, strict=True)
    module = Classifier(len(tokenizer))
    trainer = pkg.Trainer(
        max_epochs=1,
        default_root_dir=str(tmp_path),
        logger=False,
        enable_checkpointing=False,
        callbacks=[monitor],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_train_batches=2,
    )
    trainer.fit(module, datamodule=Marked(tokenizer))
    mass = monitor.history[-1]["metrics"]["mass/mean"]
    assert 0.0 < mass < 1.0  # attention on the "the" pieces of real SST-2 sentences
