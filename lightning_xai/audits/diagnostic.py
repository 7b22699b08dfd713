"""Deprecated location of Wiegreffe & Pinter's diagnostic MLP: use :mod:`lightning_xai.models.diagnostic`.

The diagnostic MLP is a model (an ``AttentionClassifier`` with a context-free encoder), and the audit layer must
not import the models; this module only re-exports it, with a ``DeprecationWarning`` when imported.
"""
import warnings

from lightning_xai.models.diagnostic import DiagnosticMLP, diagnostic_audit, evaluate_classifier

__all__ = ["DiagnosticMLP", "diagnostic_audit", "evaluate_classifier"]

warnings.warn("lightning_xai.audits.diagnostic is deprecated; import DiagnosticMLP, diagnostic_audit and "
              "evaluate_classifier from lightning_xai.models.diagnostic (or lightning_xai.models).",
              DeprecationWarning, stacklevel=2)
