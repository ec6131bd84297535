"""``purgatory bench kafka``'s account of its broker's stop-the-world pauses (``_broker_pauses.py``):
the JVM's safepoint log is parsed into pauses on the monotonic clock, and a slow record counts as
hit when a pause fell while it was in flight; the bench's broker profiles pass the launcher's
option check and a bad ``--broker-profile`` is refused by name. No Kafka: log lines as the JVM
writes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from purgatory.adapters.kafka._broker_pauses import (
    BrokerPause,
    read_pauses,
    safepoint_log_option,
    summarize,
)

# Two lines of a real ``-Xlog:safepoint:file=...:timenanos`` log (Kafka 4.3.1 broker, JDK 17),
# with a line of another tag and a torn last line between them.
LOG = (
    '[61088305047996ns] Safepoint "GenCollectForAllocation", Time since last: 400478632 ns, '
    "Reaching safepoint: 174169 ns, Cleanup: 7482 ns, At safepoint: 9679018 ns, Total: 9860669 ns\n"
    "[61088305050000ns] Using 1 worker for young collection\n"
    '[61092300520653ns] Safepoint "Cleanup", Time since last: 1000000000 ns, Reaching safepoint: '
    "11277 ns, Cleanup: 33700 ns, At safepoint: 40000 ns, Total: 84977 ns\n"
    '[61092400000000ns] Safepoint "GenCollectForAll'
)


def test_read_pauses_places_each_safepoint_before_its_logged_end() -> None:
    pauses = read_pauses(LOG)
    assert pauses == [
        BrokerPause(61088305047996 - 9860669, 61088305047996, "GenCollectForAllocation"),
        BrokerPause(61092300520653 - 84977, 61092300520653, "Cleanup"),
    ], "one pause per complete safepoint line; other tags and a torn line are skipped"
    assert pauses[0].ms == pytest.approx(9.860669)


def test_summarize_counts_pauses_in_the_window_of_at_least_min_ms() -> None:
    ms = 1_000_000
    pauses = [
        BrokerPause(0, 50 * ms, "GenCollectForAllocation"),  # ends before the window
        BrokerPause(95 * ms, 105 * ms, "GenCollectForAllocation"),  # straddles its start: counted
        BrokerPause(150 * ms, 150 * ms + ms // 2, "Cleanup"),  # under min_ms
        BrokerPause(190 * ms, 230 * ms, "GenCollectForAllocation"),
        BrokerPause(300 * ms, 310 * ms, "GenCollectForAllocation"),  # after the window
    ]
    summary = summarize(pauses, (100 * ms, 300 * ms), slow=[], min_ms=1.0)
    assert (summary.count, summary.total_ms, summary.max_ms) == (2, pytest.approx(50.0), pytest.approx(40.0))


def test_summarize_counts_a_slow_record_hit_only_when_a_pause_fell_while_it_was_in_flight() -> None:
    ms = 1_000_000
    pauses = [BrokerPause(200 * ms, 240 * ms, "GenCollectForAllocation")]
    slow = [
        (190 * ms, 245 * ms),  # sent before the pause, completed after it: hit
        (210 * ms, 260 * ms),  # sent during it: hit
        (120 * ms, 199 * ms),  # completed before it began: not hit
        (240 * ms, 290 * ms),  # sent as it ended: not hit (slow for another reason)
    ]
    summary = summarize(pauses, (100 * ms, 300 * ms), slow)
    assert (summary.slow_hit, summary.slow) == (2, 4)


def test_safepoint_log_option_names_the_file_and_the_monotonic_decoration(tmp_path: Path) -> None:
    option = safepoint_log_option(tmp_path / "safepoints.log")
    assert option == f"-Xlog:safepoint:file={tmp_path / 'safepoints.log'}:timenanos"
    assert " " not in option, "one JVM option word (the launcher rejects anything else)"


def test_bench_broker_profiles_are_valid_launcher_options() -> None:
    from purgatory.adapters.kafka.bench import BROKER_PROFILES, STEADY_STATE_PROFILE
    from purgatory.adapters.kafka.local._cluster import _checked_jvm_options

    for name, profile in BROKER_PROFILES.items():
        assert _checked_jvm_options(profile.jvm_options) == profile.jvm_options, name
    assert "-XX:TieredStopAtLevel=1" not in STEADY_STATE_PROFILE.jvm_options, "steady state: C2 too"
    assert f"-Xms{STEADY_STATE_PROFILE.heap_mb}m" in STEADY_STATE_PROFILE.jvm_options, (
        "heap fixed at its maximum"
    )


def test_an_unknown_broker_profile_is_refused_naming_it_before_any_cluster_starts() -> None:
    import typer
    from purgatory.adapters.kafka.bench import kafka
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(kafka)
    result = CliRunner().invoke(app, ["--broker-profile", "turbo"])
    assert result.exit_code == 2, result.output
    assert "turbo" in result.output and "steady" in result.output, result.output
