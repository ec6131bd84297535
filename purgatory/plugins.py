"""Plugin discovery through entry points: operation types and CLI commands.

The core never imports an adapter: adapters announce themselves in their distribution's
metadata (``purgatory.operations``, ``purgatory.cli``, ``purgatory.bench``), and the core
loads whatever is installed. A missing optional extra therefore removes a feature, not the CLI.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import structlog

from ._operation import DelayedOperation

__all__ = [
    "BENCH_GROUP",
    "CLI_GROUP",
    "OPERATIONS_GROUP",
    "PluginError",
    "load_operation_types",
    "load_plugins",
]

OPERATIONS_GROUP = "purgatory.operations"
CLI_GROUP = "purgatory.cli"
BENCH_GROUP = "purgatory.bench"

_log = structlog.get_logger("purgatory.plugins")


class PluginError(ImportError):
    """A registered plugin could not be loaded (its extra is probably not installed)."""


def _entry_points(group: str) -> list[EntryPoint]:
    return sorted(entry_points(group=group), key=lambda ep: ep.name)


def load_plugins(group: str) -> dict[str, object]:
    """Load every entry point of ``group``; ones that fail to import are logged and skipped."""
    loaded: dict[str, object] = {}
    for ep in _entry_points(group):
        try:
            loaded[ep.name] = ep.load()
        except ImportError as exc:
            _log.debug("plugin_unavailable", group=group, name=ep.name, error=str(exc))
    return loaded


def load_operation_types() -> dict[str, type[DelayedOperation]]:
    """Operation types registered under ``purgatory.operations``, by name."""
    types: dict[str, type[DelayedOperation]] = {}
    for name, obj in load_plugins(OPERATIONS_GROUP).items():
        if not (isinstance(obj, type) and issubclass(obj, DelayedOperation)):
            raise PluginError(
                f"entry point {name!r} in {OPERATIONS_GROUP} is {obj!r}, not a DelayedOperation subclass"
            )
        types[name] = obj
    return types
