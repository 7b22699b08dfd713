"""On a CUDA GPU: the audits in a user's bf16-mixed training stay non-invasive, their maps match the CPU's, and they
run under Lightning's FSDP strategy.

Skipped without a GPU (CI and the developers' machines have none); run on a lent GPU with
``python -m pytest -q tests/test_gpu.py``. The model is a user's own LightningModule around a tiny random-init BERT
(``from_config``, sdpa), on slices of the bundled SST-2 (``tests/callbacks/test_user_module.py``).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

#: where the tests run (a CPU dry run of this file's code sets these to "cpu")
ACCELERATOR, DEVICE = "gpu", "cuda"
# cuBLAS picks a deterministic reduction order only with a fixed workspace, which must be set before it starts
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _user(tmp_path):
    import pytorch_lightning as pl

    from tests.callbacks.test_user_module import sst2_tokenizer, user_classes

    tmp_path.mkdir(parents=True, exist_ok=True)
    tokenizer = sst2_tokenizer(tmp_path)
    SST2, Classifier = user_classes(pl)
    return tokenizer, SST2, Classifier


def _audits():
    from lightning_xai.callbacks import AttentionAudit, ErasureAudit

    return [
        AttentionAudit(
            methods=("gradient", "grad_x_input", "leave_one_out", "integrated_gradients"),
            method_options={"integrated_gradients": {"n_steps": 8}},
            num_samples=16,
            budget=None,
        ),
        ErasureAudit(num_samples=16, budget=None),
    ]


def _fit(tmp_path, callbacks, strategy="auto", precision="bf16-mixed", epochs=2):
    import pytorch_lightning as pl

    tokenizer, SST2, Classifier = _user(tmp_path)
    pl.seed_everything(0, verbose=False)
    model = Classifier(tokenizer.vocab_size)
    trainer = pl.Trainer(
        accelerator=ACCELERATOR,
        devices=1,
        strategy=strategy,
        precision=precision,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
    )
    trainer.fit(model, datamodule=SST2(tokenizer))
    if strategy != "auto":
        return model, None
    return model, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def test_bf16_mixed_training_on_the_gpu_is_bit_identical_with_and_without_the_audits(tmp_path):
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        _, plain = _fit(tmp_path / "plain", [])
        _, again = _fit(tmp_path / "again", [])
        if any(not torch.equal(plain[k], again[k]) for k in plain):
            pytest.skip("two plain bf16-mixed fits differ on this GPU: no determinism to compare the audits against")
        audits = _audits()
        _, audited = _fit(tmp_path / "audited", audits)
    finally:
        torch.use_deterministic_algorithms(False)
    assert [len(a.history) for a in audits] == [2, 2]
    for audit in audits:
        values = [v for v in audit.history[-1]["metrics"].values() if isinstance(v, float)]
        assert values and any(v == v for v in values)  # audited, with numbers
    assert plain.keys() == audited.keys()
    for name in plain:
        assert torch.equal(plain[name], audited[name]), name


def test_maps_on_the_gpu_match_the_cpu(tmp_path):
    from lightning_xai.adapters import HuggingFaceAdapter
    from lightning_xai.attribution import attribute

    tokenizer, SST2, Classifier = _user(tmp_path)
    torch.manual_seed(0)
    model = Classifier(tokenizer.vocab_size).model.eval()
    dm = SST2(tokenizer)
    batch = next(iter(dm.val_dataloader()))
    adapters = {
        "cpu": HuggingFaceAdapter(model, tokenizer),
        "cuda": HuggingFaceAdapter(copy.deepcopy(model).to(DEVICE).eval(), tokenizer),
    }
    on = {"cpu": batch, "cuda": {k: v.to(DEVICE) for k, v in batch.items()}}
    for method, options in (("gradient", {}), ("leave_one_out", {}), ("integrated_gradients", {"n_steps": 16})):
        cpu, gpu = (attribute(adapters[d], on[d], method, **options) for d in ("cpu", "cuda"))
        assert gpu.device.type == DEVICE
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-3, atol=1e-5, msg=method)


def test_audits_run_under_fsdp_on_one_gpu(tmp_path):
    audits = _audits()
    _fit(tmp_path, audits, strategy="fsdp", precision="bf16-mixed", epochs=1)
    assert [len(a.history) for a in audits] == [1, 1]
    for audit in audits:
        values = [v for v in audit.history[-1]["metrics"].values() if isinstance(v, float)]
        assert values and any(v == v for v in values)  # audited, with numbers
