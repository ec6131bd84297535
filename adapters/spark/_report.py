"""report.html: the journal's tables as a page a person would rather read (plots embedded).

Reads the Parquet tables with pandas/pyarrow (no Spark needed), so a report can be rebuilt from
any output directory. Plots are matplotlib PNGs embedded as base64: one self-contained file.
"""

from __future__ import annotations

import base64
import html
import io
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: render to memory only

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ._job import RunSummary

__all__ = ["REPORT_FILE", "write_report"]

REPORT_FILE = "report.html"
BAD_SAMPLE_ROWS = 20  # bad lines shown in full; all of them are in the bad_records table
HOT_KEYS_SHOWN = 10
# Completed splits into answered-ok and answered-with-error (the journal's error_code): a
# produce refused with NOT_ENOUGH_REPLICAS is not a success, though it did not expire.
OUTCOME_COLOURS = {
    "completed_ok": "#4c956c",
    "completed_error": "#8e44ad",
    "expired": "#d1495b",
    "cancelled": "#edae49",
}
# A ratio over fewer finished operations than this is not plotted (a gap, and a note says how
# many): 3 operations of which 3 expired read as a spike to 1.0 next to windows of thousands.
MIN_RATIO_OPERATIONS = 20
PERCENTILE_STYLES = {
    "latency_p50_ms": "-",
    "latency_p95_ms": "--",
    "latency_p99_ms": ":",
}
# Fewer windows than this are drawn as points only: a line through two windows reads as a trend
# (a 30 s run spans two 1-minute windows) that the data does not show.
MIN_WINDOWS_FOR_LINES = 3
LOG_SCALE_SPREAD = 100  # switch an axis to log scale when its largest value is 100x its smallest

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .3em .6em; text-align: right; }
th { background: #f4f4f4; } td.text { text-align: left; font-family: monospace; }
.note { color: #666; font-size: .85em; } img { max-width: 100%; }
.bad { color: #b00; font-weight: bold; }
"""


def _read(out_dir: Path, name: str) -> pd.DataFrame:
    path = out_dir / name
    if not path.exists() or not any(path.rglob("*.parquet")):
        return pd.DataFrame()
    frame = pd.read_parquet(path)
    return frame.drop(columns=["batch"], errors="ignore")


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _table(frame: pd.DataFrame, float_format: str = "{:,.3f}") -> str:
    if frame.empty:
        return '<p class="note">(none)</p>'
    head = "".join(f"<th>{html.escape(str(column))}</th>" for column in frame.columns)
    rows = []
    for record in frame.itertuples(index=False):
        cells = []
        for value in record:
            if isinstance(value, float):
                text, css = (
                    ("n/a" if pd.isna(value) else float_format.format(value)),
                    "",
                )
            elif isinstance(value, int):
                text, css = f"{value:,}", ""
            else:
                text, css = str(value), ' class="text"'
            cells.append(f"<td{css}>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _plain_log_scale(axis: Axes) -> None:
    """Log y axis labelled 5, 20, 300: not matplotlib's default scientific 5x10^0 labels."""
    axis.set_yscale("log")
    plain = ticker.FuncFormatter(lambda value, _pos: f"{value:g}")
    axis.yaxis.set_major_formatter(plain)
    low, high = axis.get_ylim()
    # Within one decade there may be no major tick in view: label the minor ones (2..9 x 10^k)
    # then; across decades they would crowd the axis.
    axis.yaxis.set_minor_formatter(plain if high < 10 * low else ticker.NullFormatter())


def _linestyle(style: str, windows: int) -> str:
    return style if windows >= MIN_WINDOWS_FOR_LINES else "none"


def with_outcome_columns(stats: pd.DataFrame) -> pd.DataFrame:
    """``stats`` with ``completed_ok``, ``completed_error`` and ``finished`` (tables written
    before the journal carried error codes lack them: their completed operations count as ok)."""
    stats = stats.copy()
    if "completed_error" not in stats:
        stats["completed_error"] = 0
    if "completed_ok" not in stats:
        stats["completed_ok"] = stats["completed"] - stats["completed_error"]
    if "finished" not in stats:
        stats["finished"] = stats["completed"] + stats["expired"] + stats["cancelled"]
    return stats


def window_grid(stats: pd.DataFrame) -> pd.DatetimeIndex:
    """Every window start from the first to the last, at the windows' width: the x positions
    a type with no operations in some window must show as a gap, not bridge with a line."""
    starts = pd.DatetimeIndex(sorted(stats["window_start"].unique()))
    if "window_end" in stats and len(stats):
        width = (stats["window_end"] - stats["window_start"]).min()
    elif len(starts) > 1:
        width = pd.Series(starts).diff().min()
    else:
        return starts
    if not width or pd.isna(width) or width <= pd.Timedelta(0):
        return starts
    grid = pd.date_range(starts[0], starts[-1], freq=width)
    # Windows need not be aligned to the grid's origin (a sliding layout): keep every start seen.
    return grid.union(starts)


def with_gaps(rows: pd.DataFrame, grid: pd.DatetimeIndex) -> pd.DataFrame:
    """One op_type's rows reindexed on ``grid``: NaN where the type had no row, so matplotlib
    breaks its line there instead of drawing across the empty windows."""
    return (
        rows.sort_values("window_start")
        .set_index("window_start")
        .reindex(grid)
        .rename_axis("window_start")
        .reset_index()
    )


def _full_range(axis: Axes, grid: pd.DatetimeIndex) -> None:
    """Show every window of the run: autoscaling skips NaN, so trailing empty windows (and
    suppressed ratios) would otherwise fall off the axis instead of showing as gaps."""
    if len(grid) > 1:
        margin = pd.Series(grid).diff().min() / 2  # half a window: the end points are not cut
        axis.set_xlim(grid[0] - margin, grid[-1] + margin)


def ratio_shown(rows: pd.DataFrame, column: str, minimum: int = MIN_RATIO_OPERATIONS) -> pd.Series:
    """``rows[column]`` where the window finished at least ``minimum`` operations, else NaN."""
    return rows[column].where(rows["finished"] >= minimum)


def latency_figure(stats: pd.DataFrame) -> Figure:
    """One panel per operation type: p50/p95/p99 completion latency per window (completed only)."""
    types = sorted(stats["op_type"].unique())
    grid = window_grid(stats)
    figure, axes = plt.subplots(len(types), 1, figsize=(10, 2.6 * len(types)), sharex=True, squeeze=False)
    for axis, op_type in zip(axes[:, 0], types, strict=True):
        seen = stats[stats["op_type"] == op_type]
        rows = with_gaps(seen, grid)  # NaN in empty windows: the line breaks there
        for column, style in PERCENTILE_STYLES.items():
            axis.plot(
                rows["window_start"],
                rows[column],
                linestyle=_linestyle(style, len(seen)),
                marker="o" if len(seen) < MIN_WINDOWS_FOR_LINES else ".",
                label=column.split("_")[1],
            )
        # Expired and cancelled operations have no completion latency: say so on the plot.
        axis.set_title(f"{op_type}: completion latency per window (completed operations only)", fontsize=10)
        _full_range(axis, grid)
        axis.set_ylabel("ms")
        if (seen[list(PERCENTILE_STYLES)] > 0).any().any():
            _plain_log_scale(axis)
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("window start (UTC)")
    figure.autofmt_xdate()
    return figure


def outcome_figure(stats: pd.DataFrame, min_ratio_operations: int = MIN_RATIO_OPERATIONS) -> Figure:
    """Outcome counts per type (grouped bars, each labelled; completed split into ok and with
    error) and the expiry and error ratios per window (windows with fewer than
    ``min_ratio_operations`` finished operations left out: gaps, counted in the title)."""
    stats = with_outcome_columns(stats)
    totals = stats.groupby("op_type")[list(OUTCOME_COLOURS)].sum().sort_index()
    figure, (bars, ratio) = plt.subplots(1, 2, figsize=(11, 3.6))
    # Grouped, not stacked: 3 expired next to 20,000 completed would be a sliver on a stack.
    width = 0.8 / len(OUTCOME_COLOURS)
    positions = range(len(totals.index))
    for index, (outcome, colour) in enumerate(OUTCOME_COLOURS.items()):
        offsets = [p - 0.4 + width * (index + 0.5) for p in positions]
        drawn = bars.bar(offsets, totals[outcome], width=width, color=colour, label=outcome.replace("_", " "))
        bars.bar_label(drawn, labels=[f"{int(v):,}" if v else "" for v in totals[outcome]], fontsize=7)
    bars.set_xticks(list(positions), list(totals.index))
    counts = totals.to_numpy().ravel()
    positive = counts[counts > 0]
    if len(positive) and positive.max() >= LOG_SCALE_SPREAD * positive.min():
        _plain_log_scale(bars)  # small counts stay visible next to large ones
    bars.set_title("outcomes per operation type", fontsize=10)
    bars.legend(fontsize=8)
    bars.tick_params(axis="x", labelrotation=15)
    grid = window_grid(stats)
    few = 0
    for op_type in sorted(stats["op_type"].unique()):
        seen = stats[stats["op_type"] == op_type]
        few += int((seen["finished"] < min_ratio_operations).sum())
        rows = with_gaps(seen, grid)
        lines = ratio.plot(
            rows["window_start"],
            ratio_shown(rows, "expiry_ratio", min_ratio_operations),
            linestyle=_linestyle("-", len(seen)),
            marker="o" if len(seen) < MIN_WINDOWS_FOR_LINES else ".",
            label=f"{op_type} expired",
        )
        if "error_ratio" in rows and (rows["completed_error"].fillna(0) > 0).any():
            ratio.plot(
                rows["window_start"],
                ratio_shown(rows, "error_ratio", min_ratio_operations),
                linestyle=_linestyle("--", len(seen)),
                marker="x",
                color=lines[0].get_color(),
                label=f"{op_type} with error",
            )
    _full_range(ratio, grid)
    title = "expiry and error ratios per window"
    if few:
        title += f" ({few} window(s) with < {min_ratio_operations} finished operations not plotted)"
    ratio.set_title(title, fontsize=10)
    ratio.set_ylim(bottom=0)
    ratio.grid(alpha=0.3)
    ratio.legend(fontsize=8)
    figure.autofmt_xdate()
    return figure


def _summary_from_windows(stats: pd.DataFrame) -> pd.DataFrame:
    # Streaming has no whole-journal percentiles (they cannot be merged from window percentiles).
    stats = with_outcome_columns(stats)
    totals = stats.groupby("op_type")[["created", "completed", *OUTCOME_COLOURS]].sum().reset_index()
    finished = totals[list(OUTCOME_COLOURS)].sum(axis=1)
    totals["expiry_ratio"] = (totals["expired"] / finished).where(finished > 0)
    totals["error_ratio"] = (totals["completed_error"] / finished).where(finished > 0)
    return totals


def write_report(out_dir: str | Path, *, title: str = "Delayed operations: journal analysis") -> Path:
    """Build ``report.html`` in ``out_dir`` from its tables and ``run.json``; returns its path."""
    out = Path(out_dir)
    run = RunSummary.load(out)
    stats = _read(out, "window_stats")
    summary = _read(out, "summary")
    key_counts = _read(out, "key_counts")
    bad = _read(out, "bad_records")

    parts = [f"<h1>{html.escape(title)}</h1>"]
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts.append(
        f'<p class="note">{html.escape(run.mode)} run over {html.escape(run.source)}; '
        f"windows of {html.escape(run.window)}; generated {generated}.</p>"
    )
    bad_class = ' class="bad"' if run.bad_total else ""
    counts = [
        ("journal lines read", f"{run.lines:,}"),
        (
            "events analysed (after duplicates removed)",
            f"{run.events:,}" if run.mode == "batch" else "n/a",
        ),
        ("duplicate events removed", f"{run.duplicates_removed:,}"),
        ("bad records", f"<span{bad_class}>{run.bad_total:,}</span>"),
        (
            "rows later than the watermark (dropped)",
            f"{run.late_rows_dropped:,}" if run.mode == "stream" else "n/a",
        ),
        ("windows", f"{stats['window_start'].nunique() if not stats.empty else 0:,}"),
    ]
    parts.append("<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in counts) + "</table>")

    parts.append("<h2>Per operation type</h2>")
    if summary.empty and not stats.empty:
        summary = _summary_from_windows(stats)
    parts.append(_table(summary.sort_values("op_type") if not summary.empty else summary))
    parts.append(
        '<p class="note">completed = completed_ok + completed_error: an operation whose answer was '
        "an error (its journal event's error_code, e.g. UNKNOWN_TOPIC_OR_PARTITION, "
        "NOT_ENOUGH_REPLICAS, NOT_LEADER_OR_FOLLOWER, KAFKA_UNAVAILABLE) finished early but did not "
        "succeed; expired and cancelled ones are counted apart. error_ratio = completed_error / "
        "finished, expiry_ratio = expired / finished.</p>"
    )
    parts.append(
        f'<p class="note">Latency: completion latency of completed operations (ok and with error), '
        f"from the caller's request to its answer, in ms. Percentiles by Spark's percentile_approx "
        f"with accuracy {run.accuracy:,}: "
        f"the value returned is within n/{run.accuracy:,} ranks of the exact percentile.</p>"
    )

    if not stats.empty:
        parts.append("<h2>Completion latency over time</h2>")
        parts.append(
            '<p class="note">Completed operations only: expired and cancelled ones have no '
            "completion latency (their counts are under Outcomes).</p>"
        )
        parts.append(_png(latency_figure(stats)))
        parts.append("<h2>Outcomes</h2>")
        parts.append(_png(outcome_figure(stats)))

    parts.append("<h2>Hottest watch keys</h2>")
    if key_counts.empty:
        parts.append('<p class="note">(no watch keys)</p>')
    else:
        totals = key_counts.groupby(["op_type", "key"], as_index=False)["ops"].sum()
        for op_type in sorted(totals["op_type"].unique()):
            top = (
                totals[totals["op_type"] == op_type]
                .sort_values(["ops", "key"], ascending=[False, True])
                .head(HOT_KEYS_SHOWN)[["key", "ops"]]
            )
            parts.append(f"<h3>{html.escape(op_type)}</h3>" + _table(top))

    parts.append("<h2>Bad records</h2>")
    if not run.bad_total:
        parts.append("<p>None: every line was a valid journal event.</p>")
    else:
        by_reason = pd.DataFrame(sorted(run.bad_records.items()), columns=["reason", "lines"])
        parts.append(_table(by_reason))
        if not bad.empty:
            sample = bad[["source", "reason", "value"]].head(BAD_SAMPLE_ROWS)
            parts.append(f'<p class="note">First {len(sample)} (all are in bad_records/):</p>')
            parts.append(_table(sample))

    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )
    path = out / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path
