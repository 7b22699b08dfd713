"""What reporting needs from an audit callback, as a structural type: reporting imports no callback.

Any object with these attributes is reported on — :class:`lightning_xai.callbacks.AuditCallback` and its
subclasses have them — so a new audit callback needs no change here. The final table additionally asks an
audit for ``summary_rows(metrics, full)`` when it has one (see :func:`lightning_xai.reporting.final_results`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, runtime_checkable

__all__ = ["ReportableAudit"]


@runtime_checkable
class ReportableAudit(Protocol):
    """An audit the reports can show.

    Attributes:
        log_prefix: prefix of its logged keys (titles and file names).
        history: one record per audit (``stage``, ``epoch``, ``global_step``, ``split``, ``num_examples``,
            ``metrics``).
        latest: the latest result (``stage``, ``global_step``, ``examples`` of per-example results with
            ``index``, ``split``, ``label``, ``prediction``, ``probability``, ``token_ids``, ``tokens``, ``maps``,
            ``values``; a generator's also ``target_token_ids``, ``target_tokens``, ``step_maps``), or ``None``.
        version: bumps on every audit.

    Example:
        >>> from lightning_xai.callbacks import AttentionAudit
        >>> isinstance(AttentionAudit(), ReportableAudit), isinstance(object(), ReportableAudit)
        (True, False)
    """

    log_prefix: str
    history: List[Dict[str, Any]]
    latest: Optional[Any]
    version: int

    def histogram_keys(self, examples: List[Any]) -> List[str]:
        """Per-example values whose histogram the report draws."""

    def example_tokens(self, trainer: Any, pl_module: Any, example: Any, target: bool = False) -> List[str]:
        """The words of an audited example (``target``: of a generator example's ``target_token_ids``; asked only
        for an example that has them)."""
