"""What an audit callback keeps in a checkpoint, and the settings its checkpoint key is made of.

Lightning saves a callback's ``state_dict`` under its ``state_key``: the key is made of the settings that tell two
instances of a callback class apart (:func:`state_settings`; a log prefix and a precision only when not the defaults,
so checkpoints written before they joined keep their keys); the state is the audits' history, the audit subsets
drawn and the budget's plan (:func:`audit_state`); loaded, its runs continue the latest run its history holds
(:func:`load_audit_state`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol

from lightning_xai.callbacks._audit.budget import AuditBudget
from lightning_xai.callbacks._audit.output import RunCounter
from lightning_xai.callbacks._audit.subset import AuditSubsets

__all__ = ["Keyed", "audit_state", "load_audit_state", "state_settings"]


class Keyed(Protocol):
    """The settings of an audit callback its state key reads (:class:`~lightning_xai.callbacks.AuditCallback` has
    them all)."""

    name: str
    every_n_epochs: int
    every_n_train_steps: Optional[int]
    num_samples: Optional[int]
    dataloader: str
    seed: int
    log_prefix: str
    precision: str


def state_settings(audit: Keyed) -> Dict[str, Any]:
    """The settings that tell two instances of an audit callback class apart (subclasses add their own); a log
    prefix and a precision join them only when not the defaults, so existing checkpoints keep their keys.

    Example:
        >>> from types import SimpleNamespace
        >>> audit = SimpleNamespace(name="audit", every_n_epochs=1, every_n_train_steps=None, num_samples=64,
        ...                         dataloader="val", seed=0, log_prefix="audit", precision="auto")
        >>> state_settings(audit)
        {'every_n_epochs': 1, 'every_n_train_steps': None, 'num_samples': 64, 'dataloader': 'val', 'seed': 0}
        >>> audit.log_prefix, audit.precision = "fp32", "32"
        >>> {k: v for k, v in state_settings(audit).items() if k in ("log_prefix", "precision")}
        {'log_prefix': 'fp32', 'precision': '32'}
    """
    config = {
        "every_n_epochs": audit.every_n_epochs,
        "every_n_train_steps": audit.every_n_train_steps,
        "num_samples": audit.num_samples,
        "dataloader": audit.dataloader,
        "seed": audit.seed,
    }
    optional = {"log_prefix": (audit.log_prefix, audit.name), "precision": (audit.precision, "auto")}
    return {**config, **{k: value for k, (value, default) in optional.items() if value != default}}


def audit_state(history: List[Dict[str, Any]], subsets: AuditSubsets, budget: AuditBudget) -> Dict[str, Any]:
    """A callback's ``state_dict``: a copy of its ``history``, the indices its ``subsets`` drew and its ``budget``'s
    plan.

    Example:
        >>> record = {"stage": "fit", "epoch": 0, "global_step": 2, "split": "val", "metrics": {"m": 1.0}}
        >>> state = audit_state([record], AuditSubsets("AttentionAudit"), AuditBudget(None))
        >>> state["history"] == [record] and state["history"][0]["metrics"] is not record["metrics"], state["subsets"]
        (True, {})
    """
    return {
        "history": [dict(r, metrics=dict(r["metrics"])) for r in history],
        "subsets": subsets.state_dict(),
        "budget": budget.state_dict(),
    }


def load_audit_state(
    state: Dict[str, Any], history: List[Dict[str, Any]], runs: RunCounter, subsets: AuditSubsets, budget: AuditBudget
) -> None:
    """Load the rest of :func:`audit_state` into a callback whose ``history`` is already restored
    (:func:`~lightning_xai.callbacks._audit.output.restored_history`): its ``runs`` continue the latest run that
    history holds, and the checkpoint's subsets and plan are restored into ``subsets`` and ``budget``.

    Example:
        >>> record = {"stage": "fit", "epoch": 0, "global_step": 2, "split": "val", "metrics": {}, "run": 1}
        >>> runs, subsets = RunCounter(), AuditSubsets("AttentionAudit")
        >>> load_audit_state({"subsets": {"val": [3, 5]}}, [record], runs, subsets, AuditBudget(None))
        >>> runs.run, subsets.restored
        (1, {'val': [3, 5]})
    """
    runs.restored(history)
    subsets.load_state_dict(state.get("subsets", {}))
    budget.load_state_dict(state.get("budget"))
