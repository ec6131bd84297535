"""FileJournalSink: JSON lines in size-rotated segment files."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import structlog

from ._event import JournalEvent

__all__ = ["FileJournalSink"]

_log = structlog.get_logger("purgatory.journal")

DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # a segment Spark reads as one or two splits
DEFAULT_MAX_FILES = 20  # with 64 MiB segments: ~1.3 GB of journal kept on disk at most
SEGMENT_SUFFIX = ".jsonl"


class FileJournalSink:
    """Writes events as JSON lines into ``<directory>/<prefix>-<start ms>-<seq>.jsonl`` segments.

    Rotation: once the active segment reaches ``max_bytes`` it is closed and the next write opens
    a new one; then the oldest segments beyond ``max_files`` are deleted. A closed segment never
    changes again, and a new sink never appends to an old segment (its sequence continues after
    the highest one present), so readers — the Spark job — may read the directory at any time.
    Names sort by time: the ``<start ms>`` of the process, then the sequence.

    Each batch is written with one ``write`` call and flushed, so a reader sees whole batches;
    a line cut short by a crash is reported by the Spark job as a bad record, never dropped.

    Concurrency contract: the journal's writer thread is the only caller (see ``JournalSink``).
    Two sinks must not share a directory and prefix.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
        prefix: str = "journal",
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        if isinstance(max_files, bool) or not isinstance(max_files, int) or max_files <= 0:
            raise ValueError(f"max_files must be a positive int, got {max_files!r}")
        if not prefix or "/" in prefix or os.sep in prefix:
            raise ValueError(f"prefix must be a non-empty file-name prefix, got {prefix!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.prefix = prefix
        self._started_ms = time.time_ns() // 1_000_000
        self._seq = max((self._sequence_of(path) for path in self.segments()), default=0)
        self._file: IO[str] | None = None
        self._size = 0

    def segments(self) -> list[Path]:
        """This sink's segment files, oldest first."""
        return sorted(
            self.directory.glob(f"{self.prefix}-*{SEGMENT_SUFFIX}"),
            key=lambda path: (self._start_of(path), self._sequence_of(path)),
        )

    def write(self, events: Sequence[JournalEvent]) -> None:
        if not events:
            return
        data = "".join(event.to_json() + "\n" for event in events)
        if self._file is None:
            self._open_next()
        assert self._file is not None
        self._file.write(data)
        self._file.flush()
        self._size += len(data.encode()) if not data.isascii() else len(data)
        if self._size >= self.max_bytes:
            self._rotate()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None

    def __repr__(self) -> str:
        return f"FileJournalSink({str(self.directory)!r}, prefix={self.prefix!r})"

    # -- rotation -----------------------------------------------------------------------------

    def _open_next(self) -> None:
        self._seq += 1
        path = self.directory / f"{self.prefix}-{self._started_ms:013d}-{self._seq:06d}{SEGMENT_SUFFIX}"
        # "x": never append to (or clobber) a segment someone else wrote.
        self._file = open(path, "x", encoding="utf-8")  # noqa: SIM115 - held open across writes
        self._size = 0
        self._delete_oldest()

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None

    def _delete_oldest(self) -> None:
        segments = self.segments()
        for path in segments[: max(0, len(segments) - self.max_files)]:
            try:
                path.unlink()
            except FileNotFoundError:
                pass  # removed by an operator meanwhile: the goal is reached anyway
            else:
                _log.info("journal_segment_deleted", path=str(path))

    def _start_of(self, path: Path) -> int:
        return self._field(path, 0)

    def _sequence_of(self, path: Path) -> int:
        return self._field(path, 1)

    def _field(self, path: Path, index: int) -> int:
        # <prefix>-<start ms>-<seq>.jsonl; a stranger file with the prefix sorts first, seq 0.
        parts = path.name[len(self.prefix) + 1 : -len(SEGMENT_SUFFIX)].split("-")
        try:
            return int(parts[index])
        except (IndexError, ValueError):
            return 0
