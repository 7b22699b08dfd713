"""Reports of audits: W&B tables and HTML panels, a self-contained ``report.html``, matplotlib PNGs, summaries.

The only subpackage that imports ``wandb`` — lazily, when the trainer has a ``WandbLogger``; everything else works
without it installed.
"""

from lightning_xai.reporting.curves import TrainingLog
from lightning_xai.reporting.headline import headline_html, headline_sentences
from lightning_xai.reporting.html import legend_html, render_report, score_colour, token_heatmap_html
from lightning_xai.reporting.page import write_report
from lightning_xai.reporting.plots import plot_heatmap, plot_histograms, plot_history, plot_panels
from lightning_xai.reporting.report import AuditReport
from lightning_xai.reporting.run_directory import log_report_to_wandb, run_report_directory
from lightning_xai.reporting.summary import final_results, format_summary, print_summary
from lightning_xai.reporting.wandb_logging import is_wandb_logger, log_audit_to_wandb, wandb_payload
from lightning_xai.reporting.word_pieces import merge_word_pieces

__all__ = [
    "AuditReport",
    "TrainingLog",
    "final_results",
    "format_summary",
    "headline_html",
    "headline_sentences",
    "is_wandb_logger",
    "legend_html",
    "log_audit_to_wandb",
    "log_report_to_wandb",
    "merge_word_pieces",
    "plot_heatmap",
    "plot_histograms",
    "plot_history",
    "plot_panels",
    "print_summary",
    "render_report",
    "run_report_directory",
    "score_colour",
    "token_heatmap_html",
    "wandb_payload",
    "write_report",
]
