"""Resume: a run stopped at an epoch boundary and resumed from its checkpoint audits exactly what one run audits.

Run A trains the reference ``AttentionClassifier`` for three epochs with an ``AttentionAudit`` (gradient,
leave-one-out, SmoothGrad) and ``AttentionBaselines`` (random permutations) every epoch. Run B stops after the
first epoch (``ModelCheckpoint`` at its end); then a fresh start — new Trainer, new data module, new callbacks, a
model initialised with another seed — resumes from that checkpoint for epochs 2 and 3. Lightning restores the
weights, the optimizer and the loop counters; the data module's checkpointed state restores its shuffle
generator (``SplitLoaders.state_dict``) and the audits draw only from their own seeded generators, so the audit
history of epochs 2 and 3 is bit-identical to run A's. (Before the data module checkpointed its shuffle, the
resumed epoch 2 repeated epoch 1's order and the audits of epochs 2 and 3 differed.)
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, RandomStateCheckpoint
from lightning_xai.data import TextClassificationDataModule
from lightning_xai.models import AttentionClassifier


class _Slice(TextClassificationDataModule):
    """The bundled SST-2, cut to its first 160 train and 32 validation sentences."""

    sizes = {"train": 160, "val": 32, "test": 32}

    def examples(self, split):
        return super().examples(split)[: self.sizes[split]]


def _data() -> _Slice:
    dm = _Slice("sst2", batch_size=16, seed=0)
    dm.setup("fit")
    return dm


def _audits() -> List[pl.Callback]:
    # smooth_grad and the baselines' permutations draw random numbers: they must come from the audit's own seeds.
    # budget=None: the cost budget plans from measured seconds, so on a loaded machine it may thin the cadence of
    # one run and not the other (test_budget.py tests the budget; this file tests resume)
    return [
        AttentionAudit(
            methods=("gradient", "leave_one_out", "smooth_grad"),
            method_options={"smooth_grad": {"n_samples": 3}},
            num_samples=24,
            budget=None,
        ),
        AttentionBaselines(num_samples=24, num_permutations=6, budget=None),
        AttentionAudit(
            methods=("gradient",),
            metrics=("kendall_tau",),
            every_n_epochs=0,
            every_n_train_steps=7,
            num_samples=16,
            on_validate=False,
            on_test=False,  # 10 steps an epoch: 7, 14, 21, 28
            log_prefix="step_audit",
            budget=None,
        ),
    ]  # its own keys: one column must not mix two audits' series


def _fit(
    tmp_path,
    dm: _Slice,
    init_seed: int,
    max_epochs: int,
    callbacks: List[pl.Callback],
    ckpt_path=None,
    checkpoint_dir=None,
    dropout: float = 0.0,
) -> AttentionClassifier:
    pl.seed_everything(init_seed, workers=True, verbose=False)
    model = AttentionClassifier(
        dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=0.3, vocab=dm.vocab.itos, dropout=dropout
    )
    if checkpoint_dir is not None:
        callbacks = [*callbacks, ModelCheckpoint(dirpath=checkpoint_dir, filename="{epoch}", save_top_k=-1)]
    trainer = pl.Trainer(
        max_epochs=max_epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=checkpoint_dir is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        deterministic=True,
    )
    trainer.fit(model, dm, ckpt_path=ckpt_path)
    return model


def _same(first: Dict[str, Any], second: Dict[str, Any]) -> bool:
    """Bit-for-bit equality of two history records (NaN equals NaN)."""
    if first.keys() != second.keys():
        return False
    for key in first:
        a, b = first[key], second[key]
        if key == "metrics":
            if a.keys() != b.keys() or any(
                not (x == b[k] or (math.isnan(x) and math.isnan(b[k]))) for k, x in a.items()
            ):
                return False
        elif a != b:
            return False
    return True


def test_audits_after_an_epoch_boundary_resume_are_bit_identical(tmp_path):
    dm = _data()
    straight = _audits()
    _fit(tmp_path / "a", dm, init_seed=0, max_epochs=3, callbacks=straight)
    assert [[r["epoch"] for r in audit.history] for audit in straight[:2]] == [[0, 1, 2]] * 2
    assert [r["global_step"] for r in straight[2].history] == [7, 14, 21, 28]

    first = _audits()
    _fit(tmp_path / "b", dm, init_seed=0, max_epochs=1, callbacks=first, checkpoint_dir=tmp_path / "ckpt")
    resumed = _audits()  # a fresh process: new callbacks, a model initialised with another seed, a new data module
    _fit(
        tmp_path / "b",
        _data(),
        init_seed=1,
        max_epochs=3,
        callbacks=resumed,
        ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"),
    )
    for audit, reference in zip(resumed, straight):
        assert len(audit.history) == len(reference.history)  # restored from the checkpoint, then continued
        for record, expected in zip(audit.history, reference.history):
            assert _same(record, expected), (type(audit).__name__, record["epoch"], record["global_step"])


def _resumed_audit(tmp_path, with_random_state: bool) -> Tuple[AttentionAudit, AttentionAudit, bool]:
    """Run A and a resumed run B of a model with dropout: their audits, and whether their final weights are equal."""

    def callbacks(audit: AttentionAudit) -> List[pl.Callback]:
        return [audit, RandomStateCheckpoint()] if with_random_state else [audit]

    straight, resumed = (AttentionAudit(methods=("gradient",), num_samples=24) for _ in range(2))
    final_a = _fit(tmp_path / "a", _data(), 0, 3, callbacks(straight), dropout=0.3)
    _fit(
        tmp_path / "b",
        _data(),
        0,
        1,
        callbacks(AttentionAudit(methods=("gradient",), num_samples=24)),
        checkpoint_dir=tmp_path / "ckpt",
        dropout=0.3,
    )
    final_b = _fit(
        tmp_path / "b",
        _data(),
        1,
        3,
        callbacks(resumed),
        ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"),
        dropout=0.3,
    )
    same = all(torch.equal(a, b) for a, b in zip(final_a.state_dict().values(), final_b.state_dict().values()))
    return straight, resumed, same


def test_dropout_resumes_exactly_with_the_random_state_checkpoint(tmp_path):
    # dropout draws from the global torch generator, which Lightning does not checkpoint: without the callback the
    # resumed run's masks come from seed_everything's stream and the audits after the resume differ
    straight, resumed, same = _resumed_audit(tmp_path / "plain", with_random_state=False)
    assert not same
    assert not _same(resumed.history[2], straight.history[2])
    straight, resumed, same = _resumed_audit(tmp_path / "restored", with_random_state=True)
    assert same
    assert [r["epoch"] for r in resumed.history] == [0, 1, 2]
    for record, expected in zip(resumed.history, straight.history):
        assert _same(record, expected), record["epoch"]
