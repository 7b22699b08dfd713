"""Per-process peak memory of an audit vs a training step of a BERT classifier sharded with FSDP2 (2 CPU processes).

A ``BertForSequenceClassification`` from a config (hidden 256, 4 layers, 4 heads, FFN 1024, a WordPiece vocabulary
of the 8,000 most frequent words of the bundled SST-2 train split; random weights: weights change neither memory nor
the shapes) is sharded with ``fully_shard`` per layer and on the model in an unmodified LightningModule's
``configure_model`` and trained under Lightning's ``ModelParallelStrategy`` on 2 CPU processes (gloo), batches of 16
sentences per process, with ``AttentionAudit(methods=("gradient", "integrated_gradients", "leave_one_out"))`` on 32
validation sentences at the end of the epoch. Every audited pass gathers one layer at a time, as a training step
does; under sharding every process audits the whole subset (lockstep: its passes are collectives).

Measured on each process (``/proc/self/status``): the growth of the peak resident set size (``VmHWM``, reset through
``/proc/self/clear_refs`` before each) during each training step (the largest reported) and during the audit. CPU
tensors have no allocator statistics in torch, so resident memory is the measure. Also the parameter bytes each
process holds sharded, and those the model holds in full. The reference row is the same fit unsharded in one process
(batches of the same size, the same audit).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_sharded_memory.py``
"""

from __future__ import annotations

import collections
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness as H  # noqa: E402

SIZES = {
    "full": dict(hidden=256, layers=4, heads=4, ffn=1024, vocab=8000, train=128, batch=16, audit=32),
    "quick": dict(hidden=32, layers=2, heads=2, ffn=64, vocab=300, train=16, batch=4, audit=4),
}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _mib(kib: int) -> float:
    return kib / 1024.0


def worker(out_dir: str, size: str, sharded: bool = True) -> None:
    """One process of the 2-process sharded fit (Lightning's launcher re-runs this command for process 1), or the
    unsharded fit of the same model in one process (``sharded=False``: the reference row)."""
    import lightning.pytorch as L
    import torch
    import transformers as tf
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard

    from lightning_xai.callbacks import AttentionAudit
    from lightning_xai.data import read_split

    s = SIZES[size]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    counts = collections.Counter(t.lower() for e in read_split("sst2", "train") for t in e.tokens)
    vocab = os.path.join(out_dir, "vocab.txt")
    Path(vocab).write_text("\n".join(SPECIALS + [w for w, _ in counts.most_common(s["vocab"])]) + "\n")
    tokenizer = tf.BertTokenizerFast(vocab=vocab, do_lower_case=True)

    class Data(L.LightningDataModule):
        tokenizer: Any = None

        def _loader(self, split: str, n: int) -> Any:
            rows = [
                dict(tokenizer(" ".join(e.tokens), truncation=True, max_length=64), labels=e.label)
                for e in read_split("sst2", split)[:n]
            ]
            return torch.utils.data.DataLoader(
                rows, batch_size=s["batch"], collate_fn=tf.DataCollatorWithPadding(tokenizer)
            )

        def train_dataloader(self) -> Any:
            return self._loader("train", s["train"])

        def val_dataloader(self) -> Any:
            return self._loader("val", s["audit"])

    Data.tokenizer = tokenizer

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            config = tf.BertConfig(
                vocab_size=len(tokenizer),
                hidden_size=s["hidden"],
                num_hidden_layers=s["layers"],
                num_attention_heads=s["heads"],
                intermediate_size=s["ffn"],
                max_position_embeddings=128,
                num_labels=2,
            )
            self.model = tf.BertForSequenceClassification._from_config(config, attn_implementation="eager")

        def configure_model(self) -> None:
            if not sharded:
                return
            for layer in self.model.bert.encoder.layer:
                fully_shard(layer)
            fully_shard(self.model)

        def training_step(self, batch: Dict[str, Any], batch_idx: int) -> Any:
            return self.model(**batch).loss

        def validation_step(self, batch: Dict[str, Any], batch_idx: int) -> None:
            pass

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    steps: List[float] = []
    audits: List[float] = []
    mark: Dict[str, int] = {}

    def start() -> None:
        gc.collect()
        H.reset_peak_rss()
        mark["before"] = H.proc_status_kb("VmRSS")

    def growth() -> float:
        return _mib(H.proc_status_kb("VmHWM") - mark["before"])

    class StepMemory(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            start()

        def on_train_batch_end(self, *args: Any) -> None:
            steps.append(growth())

    class MeasuredAudit(AttentionAudit):
        def run_audit(self, *args: Any, **kwargs: Any) -> Any:
            start()
            try:
                return super().run_audit(*args, **kwargs)
            finally:
                audits.append(growth())

    audit = MeasuredAudit(
        methods=("gradient", "integrated_gradients", "leave_one_out"),
        num_samples=s["audit"],
        batch_size=s["batch"],
        budget=None,
        method_options={"integrated_gradients": {"n_steps": 16}},
    )
    L.seed_everything(0, verbose=False)
    module = Classifier()
    where: Dict[str, Any] = dict(devices=1)
    if sharded:
        where = dict(devices=2, strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1))
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=out_dir,
        callbacks=[StepMemory(), audit],
        **where,
    )
    trainer.fit(module, Data())
    if sharded:  # FSDP keeps the root gathered after a no-grad forward (validation): count the shards
        for owner in (*module.model.bert.encoder.layer, module.model):
            owner.reshard()
    local = sum(
        p.to_local().numel() * p.element_size() if hasattr(p, "to_local") else p.numel() * p.element_size()
        for p in module.parameters()
    )
    full = sum(p.numel() * p.element_size() for p in module.parameters())  # a DTensor's numel is the full one
    rank = torch.distributed.get_rank() if sharded else -1
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "train_step_peak_growth_mib": steps,
                "audit_peak_growth_mib": audits,
                "audited": audit.history[0]["num_examples"] if audit.history else 0,
                "params_local_mib": local / 2**20,
                "params_full_mib": full / 2**20,
            }
        )
    )
    if sharded:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def launch(size: str, timeout: float, sharded: bool = True) -> List[Dict[str, Any]]:
    """Both processes' measurements (the fit in a fresh process group, killed on a hang); ``sharded=False``: the
    one process of the unsharded reference."""
    with tempfile.TemporaryDirectory() as out_dir:
        env = dict(
            os.environ,
            PL_DISABLE_FORK="1",
            PYTHONWARNINGS="ignore",
            PYTHONPATH=str(H.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        env.pop("LOCAL_RANK", None)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_sharded_memory",
                "--worker",
                out_dir,
                "--size",
                size,
                *([] if sharded else ["--unsharded"]),
            ],
            cwd=H.ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, stderr = proc.communicate(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.returncode != 0:
            raise RuntimeError(f"the sharded fit failed:\n{stderr[-3000:]}")
        return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in ((0, 1) if sharded else (-1,))]


def markdown(result: Dict[str, Any]) -> str:
    rows = []
    for r in result["ranks"] + result["unsharded"]:
        step, audit = max(r["train_step_peak_growth_mib"]), max(r["audit_peak_growth_mib"])
        name = f"sharded, process {r['rank']} of 2" if r["rank"] >= 0 else "unsharded, one process (reference)"
        rows.append(
            (name, step, audit, audit / step if step > 0 else float("nan"), r["params_local_mib"], r["params_full_mib"])
        )
    return "\n".join(
        [
            f"Command: `{result['command']}`  ",
            f"{result['env']['utc']}, load {result['env']['loadavg_1_5_15'][0]}, {result['env']['threads']} thread(s) per "
            f"process, torch {result['env']['torch']}; {result['ranks'][0]['audited']} sentences audited (every process "
            f"audits all of them), {len(result['ranks'][0]['train_step_peak_growth_mib'])} training steps of "
            f"{result['model']['batch']} sentences per process.",
            "",
            H.table(
                rows,
                [
                    "",
                    "training step: peak RSS growth (MiB, largest step)",
                    "audit: peak RSS growth (MiB)",
                    "audit / step",
                    "parameters held (MiB)",
                    "model parameters in full (MiB)",
                ],
            ),
        ]
    )


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None, help="(internal) one process of the sharded fit, writing here")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--unsharded", action="store_true", help="(internal) the worker runs the one-process fit")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.size, sharded=not args.unsharded)
        return {}
    threads = H.set_threads(args.threads)
    size = "quick" if args.quick else args.size
    result: Dict[str, Any] = {
        "benchmark": "sharded_memory",
        "command": H.command_line(),
        "env": H.environment(threads),
        "size": size,
        "model": SIZES[size],
    }
    result["ranks"] = launch(size, timeout=1800)
    result["unsharded"] = launch(size, timeout=1800, sharded=False)
    result["markdown"] = markdown(result)
    print(f"{result['markdown']}\n\nsaved {H.save('sharded_memory', result, args.out)}")
    return result


if __name__ == "__main__":
    main()
