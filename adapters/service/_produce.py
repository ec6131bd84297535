"""OffLoopProduce lives in the Kafka adapter (``kp.produce_async`` uses it too); named here too."""

from __future__ import annotations

from ..kafka._off_loop import OffLoopProduce

__all__ = ["OffLoopProduce"]
