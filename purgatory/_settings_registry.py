"""Which settings sections the adapters contribute: installed ones (entry points), then code's.

The core never imports an adapter (docs/design.md §2), yet ``Settings`` carries the adapters'
sections (``kafka``, ``service``, ...). Each adapter declares its section classes in its own
``settings`` module and announces them under the entry-point group ``purgatory.settings``
(pyproject.toml); :class:`SectionRegistry` loads them on first use, and code that is not installed
(a test, an application's own plugin) adds its own with ``register``. A section whose module cannot
be imported (its extra is not installed) is left out, as a missing plugin is.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

from pydantic import BaseModel

__all__ = ["SETTINGS_GROUP", "SectionRegistry"]

SETTINGS_GROUP = "purgatory.settings"

# A section's name is its TOML table and the middle of its variables (PURGATORY_<NAME>__<FIELD>):
# lower-case, and without the "__" that nests variables.
_SECTION_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


class SectionRegistry:
    """Section name -> section class: the installed sections, overlaid by those registered in code.

    ``version`` changes with every change of what ``sections()`` returns (the first load of the
    entry points included), so ``Settings`` knows when to compose its fields again.
    """

    def __init__(self, reserved: Iterable[str]) -> None:
        self._reserved = frozenset(reserved)
        self._installed: dict[str, type[BaseModel]] | None = None
        self._registered: dict[str, type[BaseModel]] = {}
        self._names: dict[type[BaseModel], str] = {}  # name_of's answers; emptied on every change
        # Re-entrant: loading an entry point imports an adapter, which may look at the settings.
        self._lock = threading.RLock()
        self.version = 1  # 0 is "nothing composed yet"

    def installed(self) -> dict[str, type[BaseModel]]:
        """The sections of the group ``purgatory.settings``, loaded once (importing their adapters)."""
        with self._lock:
            if self._installed is None:
                self._installed = {}  # set first: an adapter's import finds the load under way
                # Imported here, not at module level: plugins imports the operation model.
                from .plugins import PluginError, load_plugins

                for name, obj in load_plugins(SETTINGS_GROUP).items():
                    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
                        raise PluginError(
                            f"entry point {name!r} in {SETTINGS_GROUP} is {obj!r}, not a section class"
                        )
                    self._check_name(name)
                    self._installed[name] = obj
                self._changed()
            return self._installed

    def sections(self) -> dict[str, type[BaseModel]]:
        """Every section by name, installed ones first (by name), then registered ones."""
        with self._lock:
            return {**self.installed(), **self._registered}

    def snapshot(self) -> tuple[int, dict[str, type[BaseModel]]]:
        """``(version, sections())`` read together: what a composition of that version holds."""
        with self._lock:
            sections = self.sections()
            return self.version, sections

    def register(self, name: str, section: type[BaseModel]) -> None:
        """Add (or replace, also an installed one) the section ``name`` for this process."""
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            raise TypeError(f"settings section {name!r} must be a pydantic model class, got {section!r}")
        self._check_name(name)
        with self._lock:
            self._registered[name] = section
            self._changed()

    def unregister(self, name: str) -> None:
        """Drop the section ``name`` registered in code; an installed one of that name comes back."""
        with self._lock:
            if self._registered.pop(name, None) is None:
                raise KeyError(f"no settings section {name!r} was registered in code")
            self._changed()

    def name_of(self, section: type[BaseModel]) -> str:
        """The name ``section`` is composed under (or the one a subclass of it replaced it with)."""
        name = self._names.get(section)
        if name is not None:
            return name
        with self._lock:
            name = self._names[section] = self._find_name(section)
            return name

    def _changed(self) -> None:
        self._names.clear()
        self.version += 1

    def _find_name(self, section: type[BaseModel]) -> str:
        found = self.sections()
        exact = [name for name, cls in found.items() if cls is section]
        derived = [name for name, cls in found.items() if issubclass(cls, section)]
        names = exact or derived
        if len(names) != 1:
            problem = "is not a settings section" if not names else f"is the section of {sorted(names)}"
            raise LookupError(f"{section.__qualname__} {problem} (sections: {sorted(found)})")
        return names[0]

    def _check_name(self, name: str) -> None:
        if not _SECTION_NAME.fullmatch(name):
            raise ValueError(
                f"settings section name {name!r} must be lower-case letters, digits and single underscores"
            )
        if name in self._reserved:
            raise ValueError(f"settings section name {name!r} is a setting of the core")
