"""Names a callback is configured with, checked at construction: an unknown one fails now, not hours later."""
from __future__ import annotations

import difflib
from typing import Iterable, Sequence

from pytorch_lightning.utilities.exceptions import MisconfigurationException

__all__ = ["check_names"]


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
