"""The private machinery of :class:`~lightning_xai.callbacks.AuditCallback`, one module per concept.

Nothing outside :mod:`lightning_xai.callbacks` imports from here (an import-linter contract in ``setup.cfg``): the
public API is the callbacks and the result types :mod:`lightning_xai.callbacks` exports.
"""
