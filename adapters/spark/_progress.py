"""A rich progress line for ``purgatory analyze``: Spark's active stages and their tasks.

Spark's own console progress bar garbles the CLI's output (it is switched off in
``spark_session``). This reads the same figures from the status tracker every
``POLL_INTERVAL_S`` on a daemon thread and shows them with ``rich`` on stderr: elapsed time,
the running stages, tasks done / total. Shown only on a terminal; a pipe gets nothing.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["SparkProgress", "StatusTracker"]

POLL_INTERVAL_S = 0.5  # fast enough to look alive, rare enough to cost the driver nothing


class StatusTracker(Protocol):
    """The part of PySpark's ``StatusTracker`` read here."""

    def getActiveStageIds(self) -> list[int]: ...

    def getStageInfo(self, stageId: int) -> Any: ...


def stage_summary(tracker: StatusTracker) -> tuple[str, int, int]:
    """(description, tasks completed, tasks in total) of the active stages."""
    done = total = 0
    names = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is None:
            continue  # finished between the two calls
        done += info.numCompletedTasks
        total += info.numTasks
        names.append(str(stage_id))
    description = f"stage {', '.join(names)}" if names else "planning"
    return description, done, total


class SparkProgress:
    """``with SparkProgress(spark.sparkContext.statusTracker(), "kafka topic x"):`` around a job."""

    def __init__(self, tracker: StatusTracker, label: str, *, console: Console | None = None) -> None:
        self._tracker = tracker
        self._console = console or Console(stderr=True)
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn(f"analysing {label}: {{task.description}}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,  # the summary lines replace it when the job is done
        )
        self._task = self._progress.add_task("starting", total=None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="analyze-progress", daemon=True)

    def update(self) -> None:
        description, done, total = stage_summary(self._tracker)
        self._progress.update(self._task, description=description, completed=done, total=total or None)

    def _run(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            try:
                self.update()
            except Exception:  # a JVM shutting down under us: the display is not worth a traceback
                return

    def __enter__(self) -> SparkProgress:
        if self._console.is_terminal:
            self._progress.start()
            self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._progress.stop()
