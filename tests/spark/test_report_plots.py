"""The HTML report's plots: no trend drawn through two windows, small counts visible, plain log
labels, latency marked as completed operations only (issue 13)."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("matplotlib")

from matplotlib.figure import Figure
from purgatory.adapters.spark._report import latency_figure, outcome_figure


def _stats(windows: int, completed: int = 20_000, expired: int = 3) -> pd.DataFrame:
    rows = []
    for i in range(windows):
        for op_type in ("DelayedFetch", "DelayedProduce"):
            rows.append(
                {
                    "window_start": pd.Timestamp("2026-01-01") + pd.Timedelta(minutes=i),
                    "op_type": op_type,
                    "completed": completed,
                    "expired": expired,
                    "cancelled": 0,
                    "expiry_ratio": expired / (completed + expired),
                    "latency_p50_ms": 6.0 + i,
                    "latency_p95_ms": 8.0 + i,
                    "latency_p99_ms": 9.0 + i,
                }
            )
    return pd.DataFrame(rows)


def _lines(figure: Figure) -> list[object]:
    return [line for axis in figure.axes for line in axis.get_lines()]


def test_two_windows_are_drawn_as_points_not_a_trend_line() -> None:
    for figure in (latency_figure(_stats(2)), outcome_figure(_stats(2))):
        assert all(line.get_linestyle() == "None" for line in _lines(figure)), "no line through 2 points"


def test_many_windows_are_joined_by_lines() -> None:
    assert any(line.get_linestyle() != "None" for line in _lines(latency_figure(_stats(5))))


def test_small_outcome_counts_stay_visible_next_to_large_ones() -> None:
    figure = outcome_figure(_stats(3))
    bars = figure.axes[0]
    assert all(patch.get_y() == 0 for patch in bars.patches), "grouped bars, not stacked on each other"
    assert bars.get_yscale() == "log", "3 next to 60,000 needs a log axis to be seen"
    labels = {text.get_text() for text in bars.texts}
    assert {"9", "60,000"} <= labels, f"each bar carries its count: {labels}"


def test_log_axes_are_labelled_with_plain_numbers() -> None:
    figure = latency_figure(_stats(3))
    figure.canvas.draw()
    axis = figure.axes[0]
    assert axis.get_yscale() == "log"
    texts = [t.get_text() for t in axis.get_yticklabels() + axis.get_yticklabels(minor=True)]
    shown = [t for t in texts if t]
    assert shown, "the latency axis has labels"
    assert not any("times" in t or "\u00d7" in t or "^" in t or "$" in t for t in shown), shown


def test_latency_plots_say_they_cover_completed_operations_only() -> None:
    figure = latency_figure(_stats(3))
    assert all("completed operations only" in axis.get_title() for axis in figure.axes)
