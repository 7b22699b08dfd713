"""Run by tests/callbacks/test_distributed.py in a fresh interpreter: 2-process DDP fits (CPU, gloo), each with a
failure injected on ONE process at one stage of an audit; every process writes what happened to it to a JSON file.

Usage: ``python ddp_failure_script.py OUT_DIR STRICT STAGE[,STAGE...]`` (``STRICT``: 0 or 1). One fit per stage, one
after the other in the same two processes (Lightning's DDP launcher re-runs ``sys.argv`` for process 1; later
Trainers reuse the process group). A stage whose failure leaves one process waiting in a collective hangs here,
which the test sees as a timeout. It is a script, not a test module, for that re-run.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Dict, Iterator, List

import torch
from pytorch_lightning.loggers.logger import Logger
from pytorch_lightning.utilities.exceptions import MisconfigurationException

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "callbacks"))
from conftest import make_dm, make_model, make_trainer  # noqa: E402  (the callbacks tests' kit)

import lightning_xai.reporting.report as report_module  # noqa: E402
from lightning_xai.attribution import attribute, register_method  # noqa: E402
from lightning_xai.callbacks import (
    AttentionAudit,  # noqa: E402
    AuditExample,  # noqa: E402
)
from lightning_xai.callbacks._audit.budget import AuditBudget  # noqa: E402
from lightning_xai.reporting import AuditReport  # noqa: E402

STAGES = ("probe", "prediction", "attribution", "metrics", "gather", "logging", "budget", "report")


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def injected(stage: str) -> RuntimeError:
    return RuntimeError(f"injected {stage} failure on process {rank()}")


@register_method("fails_on_process_1")
def _fails_on_process_1(model, batch, target, *, create_graph=False):
    if rank() == 1:
        raise injected("attribution")
    return attribute(model, batch, "gradient", target)


class AuditKeysFailOnProcess0(Logger):
    """A logger whose ``log_metrics`` raises on process 0 for the audit's keys (a full disk, a lost connection)."""

    @property
    def name(self) -> str:
        return "failing"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: Dict[str, float], step: Any = None) -> None:
        if rank() == 0 and any(key.startswith("attention_audit/") for key in metrics):
            raise injected("logging")


@contextmanager
def patched(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def fail_on(
    process: int, stage: str, original: Callable[..., Any], when: Callable[..., bool] = lambda *a: True
) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if rank() == process and when(*args):
            raise injected(stage)
        return original(*args, **kwargs)

    return wrapper


def injection(stage: str) -> Any:
    """The patch that makes ``stage`` fail on one process (the module a helper is looked up in is found from
    the method that calls it, so the injection follows the helper if it moves)."""
    planner = sys.modules[AuditBudget.choose.__module__]  # the callback's budget calls plan() there
    if stage == "probe":  # the two-example probe before fit: a configuration error on one process's shard

        def probe(original):
            def check_model(self, *args, **kwargs):
                if rank() == 1:
                    raise MisconfigurationException(
                        "AttentionAudit needs the model's attention: injected probe failure on process 1"
                    )
                return original(self, *args, **kwargs)

            return check_model

        return patched(AttentionAudit, "check_model", probe)
    if stage == "prediction":  # the audit's forward pass (not the probe's: that one runs before the check is noted)
        return patched(AttentionAudit, "predict", lambda o: fail_on(1, stage, o, lambda self, *a: self._runner.checked))
    if stage == "metrics":  # the logged scalars from the gathered examples
        return patched(AttentionAudit, "aggregate", lambda o: fail_on(1, stage, o))
    if stage == "gather":  # one process cannot pickle its examples for the gather

        def unpicklable(original):
            def reduce_ex(self, protocol):
                if rank() == 1:
                    raise injected("gather")
                return original(self, protocol)

            return reduce_ex

        return patched(AuditExample, "__reduce_ex__", unpicklable)
    if stage == "budget":  # sizing the audit to the budget, before the plan is broadcast
        return patched(planner, "plan", lambda o: fail_on(1, stage, o))
    if stage == "report":  # AuditReport writes the page on process 0 only
        return patched(report_module, "write_report", lambda o: fail_on(0, stage, o))
    return nullcontext()  # attribution and logging fail by themselves (fails_on_process_1, AuditKeysFailOnProcess0)


def run(stage: str, strict: bool, root: str) -> Dict[str, Any]:
    dm = make_dm(batch_size=8, train=32, val=16, test=16)
    model = make_model(dm)
    audit = AttentionAudit(
        methods=("fails_on_process_1" if stage == "attribution" else "gradient",),
        metrics=("kendall_tau",),
        num_samples=8,
        batch_size=4,
        every_n_epochs=1,
        strict=strict,
    )
    callbacks: List[Any] = [audit]
    if stage == "report":
        callbacks.append(AuditReport(dirpath=os.path.join(root, f"report_{strict}"), png=False, wandb=False))
    trainer = make_trainer(
        root,
        callbacks,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=[AuditKeysFailOnProcess0()] if stage == "logging" else False,
    )
    outcome, misconfigured = "finished", False
    with warnings.catch_warnings(record=True) as caught, injection(stage):
        warnings.simplefilter("always")
        try:
            trainer.fit(model, dm)
        except Exception as err:  # noqa: BLE001 - what each process raised is the result
            outcome, misconfigured = f"{type(err).__name__}: {err}", isinstance(err, MisconfigurationException)
    return {
        "outcome": outcome,
        "misconfigured": misconfigured,
        "history": len(audit.history),
        "failures": audit._failures.count,
        "warnings": [str(w.message) for w in caught],
    }


def main(out_dir: str, strict: bool, stages: List[str]) -> None:
    torch.set_num_threads(1)
    results = {stage: run(stage, strict, out_dir) for stage in stages}
    with open(os.path.join(out_dir, f"rank{rank()}.json"), "w") as handle:
        json.dump(results, handle)
    # tear the gloo group down before exit: left to interpreter shutdown, its threads can abort the process
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "1", sys.argv[3].split(","))
