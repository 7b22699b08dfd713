"""Issue 19, items 5-7: a failing audit never ends training, faithfulness is monitorable, the cost is announced."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import nn

from lightning_xai.adapters import HookAdapter, ProtocolError
from lightning_xai.attribution import ATTRIBUTION_METHODS, register_method
from lightning_xai.callbacks import AttentionAudit, ErasureAudit

KEY = "attention_audit/kendall_tau/attention_vs_gradient/mean"


@pytest.fixture()
def failing_method():
    """An attribution method that draws from the global RNG, flips the model to train mode, then raises."""

    @register_method("fails_after_side_effects")
    def fails(model, batch, target, *, create_graph=False):
        torch.rand(3)
        model.train()
        raise RuntimeError("deliberate failure inside the audit")

    yield "fails_after_side_effects"
    del ATTRIBUTION_METHODS["fails_after_side_effects"]


def _fit(kit, tmp_path, callbacks, epochs=2):
    dm = kit.make_dm()
    model = kit.make_model(dm, dropout=0.3)  # dropout: a stray RNG draw would change the weights
    trainer = kit.make_trainer(tmp_path, callbacks, max_epochs=epochs)
    trainer.fit(model, dm)
    return trainer, model.state_dict()


def test_a_failing_audit_is_reported_once_and_training_runs_to_the_end(kit, tmp_path, failing_method):
    plain_trainer, plain = _fit(kit, tmp_path / "plain", [])
    audit = AttentionAudit(
        methods=("gradient", failing_method), metrics=("kendall_tau",), num_samples=16, every_n_epochs=1
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, audited = _fit(kit, tmp_path / "audited", [audit])
    reports = [str(w.message) for w in caught if "deliberate failure" in str(w.message)]
    assert len(reports) == 1  # two failed audits (epochs 0 and 1), one warning for the exception type
    assert "AttentionAudit" in reports[0] and "RuntimeError" in reports[0] and "strict=True" in reports[0]
    assert audit._failures.count == 2 and audit.history == []
    assert trainer.current_epoch == plain_trainer.current_epoch == 2
    assert trainer.global_step == plain_trainer.global_step
    assert audited.keys() == plain.keys()
    for name in plain:  # RNG, train mode and gradients restored although the audit raised half-way
        assert torch.equal(plain[name], audited[name]), name


def test_strict_re_raises_the_audit_exception(kit, tmp_path, failing_method):
    audit = AttentionAudit(
        methods=(failing_method,), metrics=("kendall_tau",), num_samples=16, strict=True, every_n_epochs=1
    )
    with pytest.raises(RuntimeError, match="deliberate failure inside the audit"):
        _fit(kit, tmp_path, [audit], epochs=1)


def test_strict_must_be_a_bool():
    with pytest.raises(MisconfigurationException, match=r"strict\) must be True or False"):
        ErasureAudit(strict="yes")


class _SelfAttentionNet(nn.Module):
    """A user's one-layer transformer classifier built on ``nn.MultiheadAttention``."""

    def __init__(self, vocab_size: int, need_weights: bool) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.emb = nn.Embedding(vocab_size, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, 2)

    def forward(self, ids, mask):
        x = self.emb(ids)
        h, _ = self.attn(x, x, x, key_padding_mask=~mask, need_weights=self.need_weights, average_attn_weights=False)
        return self.out((h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True))


class _UserModule(pl.LightningModule):
    """A LightningModule that trains its network and shows it to the audits through a HookAdapter."""

    def __init__(self, vocab_size: int, need_weights: bool, pooling=None) -> None:
        super().__init__()
        self.net = _SelfAttentionNet(vocab_size, need_weights)
        object.__setattr__(
            self,
            "adapter",
            HookAdapter(
                self.net,
                embedding="emb",
                attention="attn",
                attention_index=1,
                pooling=pooling,
                forward_fn=lambda m, b: m(b["input_ids"], b["mask"]),
            ),
        )

    def token_mask(self, batch):
        return self.adapter.token_mask(batch)

    def embed(self, batch):
        return self.adapter.embed(batch)

    def forward_from_embeddings(self, embeddings, batch, attention_override=None):
        return self.adapter.forward_from_embeddings(embeddings, batch, attention_override=attention_override)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch["input_ids"], batch["mask"]), batch["labels"])

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_multihead_attention_without_its_pooling_is_named_at_setup(kit, tmp_path):
    """Issue 30: nn.MultiheadAttention called with need_weights=False is audited unchanged, once the adapter is told
    where the classifier reads (here: the mean over the real tokens); without it, setup names the options."""
    dm = kit.make_dm()
    pl.seed_everything(0, verbose=False)
    model = _UserModule(dm.vocab_size, need_weights=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = kit.make_trainer(tmp_path, [AttentionAudit(methods=("gradient",), num_samples=16)], max_epochs=1)
    named = r"self-attention .*pooling='first'.*pooling='mean'.*query_index"
    with pytest.raises(MisconfigurationException, match=named):
        trainer.fit(model, dm)
    assert trainer.global_step == 0  # caught before the first training step
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    pl.seed_everything(0, verbose=False)
    said = _UserModule(dm.vocab_size, need_weights=False, pooling="mean")
    audit = AttentionAudit(methods=("gradient",), num_samples=16)
    kit.make_trainer(tmp_path, [audit], max_epochs=1).fit(said, dm)
    assert [r["epoch"] for r in audit.history] == [0]


class _UnusedSoftmaxNet(nn.Module):
    """Attention weights computed for show: the logits read the plain mean of the embeddings."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.emb, self.score, self.attn, self.out = (
            nn.Embedding(vocab_size, 16),
            nn.Linear(16, 1),
            nn.Softmax(dim=-1),
            nn.Linear(16, 2),
        )

    def forward(self, ids, mask):
        x = self.emb(ids)
        self.shown = self.attn(self.score(x).squeeze(-1).masked_fill(~mask, float("-inf")))
        return self.out((x * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True))


def test_probe_refuses_attention_weights_that_do_not_feed_the_logits(kit):
    dm = kit.make_dm()
    batch = next(iter(dm.val_dataloader()))
    pl.seed_everything(0, verbose=False)
    unused = HookAdapter(
        _UnusedSoftmaxNet(dm.vocab_size),
        embedding="emb",
        attention="attn",
        forward_fn=lambda m, b: m(b["input_ids"], b["mask"]),
    )
    with pytest.raises(ProtocolError, match="does not feed the logits"):
        unused.probe(batch)
    _UserModule(dm.vocab_size, need_weights=True, pooling="mean").adapter.probe(batch)  # MHA's weights now do


def test_model_checkpoint_and_early_stopping_monitor_an_audit_key(kit, tmp_path):
    dm = kit.make_dm()
    # every_n_epochs given explicitly: the test needs an audit every epoch, whatever the default cadence
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=16, every_n_epochs=1)
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "ckpt",
        monitor=KEY,
        mode="max",
        save_top_k=1,
        filename=f"{{epoch}}-tau={{{KEY}:.4f}}",
        auto_insert_metric_name=False,
    )
    stopping = EarlyStopping(monitor=KEY, mode="max", patience=10)
    trainer = kit.make_trainer(tmp_path, [audit, checkpoint, stopping], max_epochs=3, enable_checkpointing=True)
    trainer.fit(kit.make_model(dm), dm)
    taus = [r["metrics"]["kendall_tau/attention_vs_gradient/mean"] for r in audit.history]
    assert len(taus) == 3 and len(set(taus)) > 1  # the monitored value moves between epochs
    best = max(range(3), key=lambda i: taus[i])
    assert checkpoint.best_model_score.item() == pytest.approx(taus[best], abs=1e-6)
    assert checkpoint.best_model_path.endswith(f"{best}-tau={taus[best]:.4f}.ckpt")
    assert stopping.best_score.item() == pytest.approx(taus[best], abs=1e-6)
    assert trainer.callback_metrics[KEY].item() == pytest.approx(taus[-1], abs=1e-6)


def test_the_first_audit_announces_its_cost_against_the_training_epoch(kit, tmp_path, caplog):
    dm = kit.make_dm()
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=16, every_n_epochs=1)
    logger = CSVLogger(str(tmp_path), name="csv")
    trainer = kit.make_trainer(tmp_path, [audit], max_epochs=2, logger=logger)
    with caplog.at_level(logging.INFO):
        trainer.fit(kit.make_model(dm), dm)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("AttentionAudit: the first audit")]
    assert len(lines) == 1, lines
    found = re.fullmatch(
        r"AttentionAudit: the first audit took ([\d.]+) s, ([\d.]+)% of the training epoch it ran "
        r"in \(([\d.]+) s without audits\)\.",
        lines[0],
    )
    assert found, lines[0]
    seconds, percent, training = map(float, found.groups())
    with open(f"{logger.log_dir}/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged_seconds = [float(r["attention_audit/cost/seconds"]) for r in rows if r.get("attention_audit/cost/seconds")]
    shares = [float(r["attention_audit/cost/share"]) for r in rows if r.get("attention_audit/cost/share")]
    assert len(logged_seconds) == 2 and len(shares) == 2  # every audit's time, every audited epoch's share
    assert logged_seconds[0] == pytest.approx(seconds, abs=0.05)
    assert 0 < shares[0] and math.isclose(100 * shares[0], percent, abs_tol=0.05 + 100 * 0.05 / training)


_ONE_RANK_FAILS = textwrap.dedent("""
    import json, sys, warnings, torch
    sys.path.insert(0, {conftest_dir!r})
    from conftest import make_dm, make_model, make_trainer
    from lightning_xai.attribution import attribute, register_method
    from lightning_xai.callbacks import AttentionAudit
    torch.set_num_threads(1)

    @register_method("fails_on_process_1")
    def fails(model, batch, target, *, create_graph=False):
        if torch.distributed.get_rank() == 1:
            raise RuntimeError("out of memory on this process only")
        return attribute(model, batch, "gradient", target)

    dm = make_dm()
    model = make_model(dm)
    audit = AttentionAudit(methods=("fails_on_process_1",), num_samples=20, batch_size=4, budget=None,
                           strict={strict})
    trainer = make_trainer({root!r}, [audit], accelerator="cpu", devices=2, strategy="ddp", max_epochs=2)
    outcome = "finished"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(model, dm)
        except Exception as err:
            outcome = type(err).__name__ + ": " + str(err)
    json.dump({{"epochs": trainer.current_epoch, "history": len(audit.history), "outcome": outcome,
               "failures": audit._failures.count, "warnings": [str(w.message) for w in caught]}},
              open({root!r} + f"/rank{{torch.distributed.get_rank()}}.json", "w"))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.parametrize("strict", [False, True])
def test_an_audit_failing_on_one_ddp_process_is_skipped_on_both(tmp_path, strict):
    """Out of memory on one GPU, say: the other process must not wait forever in the audit's gather."""
    script = tmp_path / "one_rank_fails.py"
    script.write_text(_ONE_RANK_FAILS.format(conftest_dir=os.path.dirname(__file__), root=str(tmp_path), strict=strict))
    env = dict(os.environ, OMP_NUM_THREADS="1", PL_DISABLE_FORK="1")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    if strict:  # raised on both: the failing process its own error, the other one naming it
        assert "out of memory on this process only" in ranks[1]["outcome"]
        assert ranks[0]["outcome"].startswith("AuditFailedOnAnotherProcess") and "process 1" in ranks[0]["outcome"]
        return
    assert [r["outcome"] for r in ranks] == ["finished", "finished"]
    assert [r["epochs"] for r in ranks] == [2, 2] and [r["history"] for r in ranks] == [0, 0]
    assert [r["failures"] for r in ranks] == [2, 2]  # skipped on both processes at both epochs
    reported = [w for w in ranks[0]["warnings"] if "AttentionAudit" in w and "failed" in w]
    assert reported and "process 1" in reported[0] and "out of memory" in reported[0]
