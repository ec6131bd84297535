"""How an operation finished."""

from __future__ import annotations

import enum

__all__ = ["Outcome"]


class Outcome(enum.Enum):
    """Why a delayed operation finished; set once, before ``on_complete`` runs."""

    COMPLETED = "completed"  # its condition held: try_complete / force_complete
    EXPIRED = "expired"  # its timeout passed, or the purgatory drained it at shutdown
    CANCELLED = "cancelled"  # its awaiting asyncio task was cancelled
