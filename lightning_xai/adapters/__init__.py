"""How a model is seen: the :class:`ExplainableModel` protocol and the adapters that implement it."""
from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput, ProtocolError, as_explainable

__all__ = ["Batch", "ExplainOutput", "ExplainableModel", "ProtocolError", "as_explainable"]
