"""The HTML report's plots: no trend drawn through two windows, small counts visible, plain log
labels, latency marked as completed operations only (issue 13); gaps for empty windows, no ratio
of a handful of operations, completed split into ok and with error (issue 28)."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("matplotlib")

from matplotlib.figure import Figure
from purgatory.adapters.spark._report import (
    MIN_RATIO_OPERATIONS,
    latency_figure,
    outcome_figure,
    ratio_shown,
    window_grid,
    with_outcome_columns,
)
from purgatory.tools.bench.spark.pipeline import marginal_line


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


def _sparse_stats() -> pd.DataFrame:
    """DelayedFetch in windows 0, 1, 2 and 5 (3 and 4 empty); window 5 finished only 3 operations."""
    rows = []
    for i, (completed, errors, expired) in {
        0: (500, 5, 2),
        1: (400, 0, 1),
        2: (450, 50, 0),
        5: (0, 0, 3),
    }.items():
        start = pd.Timestamp("2026-01-01") + pd.Timedelta(minutes=i)
        finished = completed + expired
        rows.append(
            {
                "window_start": start,
                "window_end": start + pd.Timedelta(minutes=1),
                "op_type": "DelayedFetch",
                "created": finished,
                "completed": completed,
                "completed_ok": completed - errors,
                "completed_error": errors,
                "expired": expired,
                "cancelled": 0,
                "finished": finished,
                "expiry_ratio": expired / finished,
                "error_ratio": errors / finished,
                "latency_p50_ms": 5.0 if completed else float("nan"),
                "latency_p95_ms": 7.0 if completed else float("nan"),
                "latency_p99_ms": 9.0 if completed else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def test_empty_windows_are_gaps_not_lines_drawn_across_them() -> None:
    stats = _sparse_stats()
    grid = window_grid(stats)
    assert len(grid) == 6, "every window from the first to the last, the empty ones included"
    line = latency_figure(stats).axes[0].get_lines()[0]
    ys = pd.Series(line.get_ydata(), dtype=float)
    assert len(ys) == 6 and ys.iloc[3:6].isna().all(), (
        "windows 3 and 4 (empty) and 5 (no completion) are gaps"
    )
    assert ys.iloc[:3].notna().all()


def test_ratios_of_windows_with_few_operations_are_not_plotted() -> None:
    figure = outcome_figure(_sparse_stats(), min_ratio_operations=MIN_RATIO_OPERATIONS)
    ratio_axis = figure.axes[1]
    expired = next(line for line in ratio_axis.get_lines() if line.get_label() == "DelayedFetch expired")
    ys = pd.Series(expired.get_ydata(), dtype=float)
    assert ys.iloc[5] != ys.iloc[5], "3 operations, all expired: not a spike to 1.0 but a gap"
    assert ys.max() < 0.01
    assert "1 window(s) with < 20 finished operations not plotted" in ratio_axis.get_title()
    assert ratio_shown(_sparse_stats(), "expiry_ratio", 2).notna().all(), "above the minimum: shown"


def test_completed_splits_into_ok_and_with_error_in_the_outcome_bars() -> None:
    bars = outcome_figure(_sparse_stats()).axes[0]
    labels = {text.get_text() for text in bars.texts}
    assert {"1,295", "55", "6"} <= labels, labels  # completed ok, completed with error, expired
    legend = [text.get_text() for text in bars.get_legend().get_texts()]
    assert legend[:2] == ["completed ok", "completed error"]


def test_tables_written_before_error_codes_read_as_all_completed_ok() -> None:
    old = _stats(2).drop(columns=[])  # no completed_ok / completed_error / finished columns
    filled = with_outcome_columns(old)
    assert (filled["completed_ok"] == filled["completed"]).all() and (filled["completed_error"] == 0).all()


@pytest.mark.parametrize(
    ("small_s", "large_s", "meaningful"),
    [(10.0, 20.0, True), (10.0, 10.5, False), (10.0, 9.0, False), (10.0, 10.0, False)],
)
def test_the_pipeline_bench_prints_a_marginal_rate_only_when_measurable(
    small_s: float, large_s: float, meaningful: bool
) -> None:
    line = marginal_line(1_000_000, small_s, 2_000_000, large_s)
    if meaningful:
        assert line.startswith("marginal rate 100,000 rows/s"), line
    else:
        assert "not measurable" in line and "rows/s" not in line, line
