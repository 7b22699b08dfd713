"""DeceptionPenalty: per-step cost of training with Pruthi et al.'s penalty vs plain cross-entropy training.

The reference AttentionClassifier (embedding 300, packed BiLSTM 128/direction, tanh attention) is trained with a
real ``pl.Trainer`` on the bundled ``sst_wiki`` train split (batch 32, which has the ``impermissible`` masks),
from the same initial weights and on the same batches, once with ``objectives=[DeceptionPenalty(weight=1.0)]`` and
once without. A callback times every optimisation step (``on_train_batch_start`` → ``on_train_batch_end``:
forward, losses, backward, optimiser step, logging). Runs alternate (plain, penalty, plain, ...) and the first
``--skip`` steps of each run are dropped; the figure is the ratio of median step times.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_deception.py``
"""

from __future__ import annotations

import copy
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from benchmarks import models as M  # noqa: E402

TARGET = 0.05


class StepTimer(pl.Callback):
    def __init__(self) -> None:
        self.times = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self._start)


def main(argv=None) -> dict:
    parser = H.common_args(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimisation steps per run")
    parser.add_argument("--skip", type=int, default=3, help="first steps of every run not counted")
    parser.add_argument("--dataset", default="sst_wiki")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--embedding", type=int, default=300)
    args = parser.parse_args(argv)
    threads = H.set_threads(args.threads)
    if args.quick:
        args.repeats, args.steps, args.skip, args.hidden, args.embedding = 2, 4, 1, 16, 32
    warnings.filterwarnings("ignore")
    from lightning_xai.data import collate
    from lightning_xai.losses.deception import DeceptionPenalty
    from lightning_xai.models import AttentionClassifier

    dm = M.datamodule(args.dataset)
    train = dm.dataset("train")
    torch.manual_seed(0)
    initial = AttentionClassifier(dm.vocab_size, dm.num_classes, embedding_dim=args.embedding, hidden_dim=args.hidden)
    batches = [collate([train[i] for i in range(k * 32, (k + 1) * 32)]) for k in range(args.steps)]

    def run(penalty: bool):
        model = copy.deepcopy(initial)
        if penalty:
            model.objectives.append(DeceptionPenalty(weight=1.0))
        timer = StepTimer()
        trainer = pl.Trainer(
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[timer],
            num_sanity_val_steps=0,
            default_root_dir=str(H.CACHE / "trainer"),
        )
        loader = torch.utils.data.DataLoader(batches, batch_size=None)
        trainer.fit(model, loader)
        return timer.times[args.skip :]

    times = {"plain": [], "deception": []}
    run(False)  # warm-up
    for r in range(args.repeats):
        order = ("plain", "deception") if r % 2 == 0 else ("deception", "plain")
        for name in order:
            times[name].extend(run(name == "deception"))
    med = {k: H.median(v) for k, v in times.items()}
    overhead = med["deception"] / med["plain"] - 1.0
    result = {
        "benchmark": "deception_penalty",
        "command": H.command_line(),
        "env": H.environment(threads),
        "dataset": args.dataset,
        "steps_per_run": args.steps,
        "runs_each": args.repeats,
        "median_step_seconds": med,
        "steps_counted": {k: len(v) for k, v in times.items()},
        "overhead": overhead,
        "met": overhead <= TARGET,
        "model": f"AttentionClassifier(embedding {args.embedding}, bilstm {args.hidden}, tanh), batch 32",
    }
    result["markdown"] = markdown(result)
    path = H.save("deception", result, args.out)
    print(result["markdown"])
    print(f"\nsaved {path}")
    return result


def markdown(r: dict) -> str:
    med = r["median_step_seconds"]
    lines = [
        f"**DeceptionPenalty per training step**, {r['model']}, `{r['dataset']}` train, {r['runs_each']} "
        f"alternating runs × {r['steps_per_run']} steps each; {r['env']['threads']} threads, {r['env']['utc']}, "
        f"load {r['env']['loadavg_1_5_15']}.",
        "",
        f"Command: `{r['command']}`",
        "",
    ]
    lines.append(
        H.table(
            [
                ("plain CE", med["plain"] * 1e3, "", "", ""),
                (
                    "CE + DeceptionPenalty(weight=1)",
                    med["deception"] * 1e3,
                    r["overhead"] * 100,
                    "≤ 5%",
                    "yes" if r["met"] else "**no**",
                ),
            ],
            ("training step", "median ms", "overhead %", "target", "met?"),
        )
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
