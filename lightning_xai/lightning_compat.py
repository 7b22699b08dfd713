"""One code base for both Lightning packages: ``pytorch_lightning`` and ``lightning.pytorch``.

Lightning ships the same trainer under two import names whose classes are distinct: a ``lightning.pytorch``
Trainer accepts only callbacks that are instances of ``lightning.pytorch.Callback``, a ``pytorch_lightning``
Trainer only instances of ``pytorch_lightning.Callback``. Neither is an ABC (no virtual subclasses), so
:class:`Callback` derives from both (from the second only when ``lightning`` is installed); the hooks are
no-ops in both, so which one the MRO finds first does not matter. :func:`is_overridden` answers Lightning's
"does this LightningModule/DataModule override hook X" for objects of either package (Lightning's own helper
raises on objects of the other package).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Optional, Tuple, Type

import pytorch_lightning
from pytorch_lightning.utilities.exceptions import MisconfigurationException

__all__ = ["CALLBACK_BASES", "Callback", "MISCONFIGURATION_ERRORS", "is_overridden"]

_PACKAGES = ("pytorch_lightning.", "lightning.pytorch.")

_lightning_pytorch: Optional[ModuleType]
_lightning_misconfiguration: Type[BaseException]
try:  # pragma: no branch - depends on what is installed
    import lightning.pytorch as _lightning_pytorch
    from lightning.fabric.utilities.exceptions import MisconfigurationException as _LightningMisconfiguration

    _lightning_misconfiguration = _LightningMisconfiguration
except ImportError:  # pragma: no cover - lightning not installed
    _lightning_pytorch = None
    _lightning_misconfiguration = MisconfigurationException

#: the Callback classes of the installed Lightning packages (``pytorch_lightning`` first)
CALLBACK_BASES: Tuple[Type, ...] = (pytorch_lightning.Callback,) + (
    (_lightning_pytorch.Callback,) if _lightning_pytorch is not None else ()
)

#: ``MisconfigurationException`` of both packages (``lightning.fabric``'s is a class of its own), for ``except``
MISCONFIGURATION_ERRORS: Tuple[Type[BaseException], ...] = tuple(
    {MisconfigurationException, _lightning_misconfiguration}
)


if TYPE_CHECKING:
    # mypy takes no bases from a computed tuple ("Invalid base class"): to a type checker, Callback is
    # pytorch_lightning's, whose hooks and signatures lightning.pytorch's repeats.
    class Callback(pytorch_lightning.Callback):
        """The base of every lightning_xai callback (the class defined below at run time)."""
else:

    class Callback(*CALLBACK_BASES):
        """The base of every lightning_xai callback: a callback of both Lightning packages.

        Example:
            >>> import pytorch_lightning
            >>> isinstance(Callback(), pytorch_lightning.Callback)
            True
            >>> import lightning.pytorch
            >>> isinstance(Callback(), lightning.pytorch.Callback)
            True
        """


def is_overridden(name: str, instance: object) -> bool:
    """Whether ``instance``'s class (a LightningModule or DataModule of either package) defines hook ``name``
    itself rather than inheriting Lightning's default.

    Example:
        >>> import lightning.pytorch as L
        >>> class Data(L.LightningDataModule):
        ...     def val_dataloader(self):
        ...         return []
        >>> is_overridden("val_dataloader", Data()), is_overridden("test_dataloader", Data())
        (True, False)
    """
    for cls in type(instance).__mro__:
        if name in vars(cls):
            return not cls.__module__.startswith(_PACKAGES)
    return False
