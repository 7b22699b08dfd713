"""Names a callback is configured with, checked at construction: an unknown one fails now, not hours later."""
from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping, Sequence

from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.attribution.core import ATTRIBUTION_METHODS, check_method_options

__all__ = ["check_names", "check_options_of_methods"]


def check_names(owner: str, kind: str, names: Sequence[str], known: Iterable[str], hint: str = "") -> None:
    """Raise a :class:`MisconfigurationException` for the first of ``names`` not in ``known``, naming its close
    matches (``difflib``) and every known name.

    Args:
        owner: the callback, as the message names it.
        kind: what the names are (``"method"``, ``"ranking"``).
        names: the configured names.
        known: the accepted names.
        hint: appended to the message (e.g. how to register a new name).

    Example:
        >>> check_names("AttentionAudit", "method", ["gradiant"], ["gradient", "leave_one_out"])
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit: unknown method 'gradiant'; did you mean 'gradient'? Known: ['gradient', 'leave_one_out'].
    """
    accepted = sorted(set(known))
    for name in names:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=3, cutoff=0.6)
            suggestion = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
            raise MisconfigurationException(f"{owner}: unknown {kind} {name!r}{suggestion} Known: {accepted}{hint}.")


def check_options_of_methods(owner: str, method_options: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise a :class:`MisconfigurationException` for the first option of ``method_options`` (method name ->
    ``attribute`` keyword options) that its method does not take, so a misspelled key fails at construction
    rather than at the first audit. Names that are not attribution methods (an audit's own rankings) are skipped.

    Example:
        >>> check_options_of_methods("AttentionAudit", {"integrated_gradients": {"n_step": 8}})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit(method_options): Method 'integrated_gradients' got unknown option(s) ['n_step'] ('n_step': did you mean 'n_steps'?); ...
    """
    for method, options in method_options.items():
        if method not in ATTRIBUTION_METHODS:
            continue
        if not isinstance(options, Mapping):
            raise MisconfigurationException(f"{owner}(method_options)[{method!r}] must be a dict of keyword options "
                                            f"for attribute(), got {type(options).__name__}.")
        try:
            check_method_options(method, options)
        except (TypeError, ValueError) as err:
            raise MisconfigurationException(f"{owner}(method_options): {err}") from None
