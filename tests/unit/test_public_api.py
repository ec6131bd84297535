"""The public names of DESIGN §3.5 import as documented."""

from __future__ import annotations


def test_public_names_import_from_the_package() -> None:
    from purgatory import (  # noqa: F401
        DelayedOperation,
        DelayedOperationPurgatory,
        MockTimer,
        Outcome,
        PurgatoryClosedError,
        PurgatoryError,
        PurgatoryFullError,
        SystemTimer,
        TimerTask,
    )
    from purgatory.testing import MockTime
    from purgatory.testing import MockTimer as TestingMockTimer

    assert issubclass(PurgatoryFullError, PurgatoryError)
    assert issubclass(PurgatoryClosedError, PurgatoryError)
    assert MockTimer is TestingMockTimer
    assert MockTime(5).milliseconds() == 5


def test_adapters_are_installed_under_the_purgatory_namespace() -> None:
    import importlib.metadata
    import importlib.util

    assert importlib.util.find_spec("purgatory.adapters.kafka") is not None
    top_level = importlib.metadata.distribution("kafka-purgatory").read_text("top_level.txt") or ""
    assert top_level.split() == ["purgatory"], f"only 'purgatory' may be installed top-level: {top_level!r}"
