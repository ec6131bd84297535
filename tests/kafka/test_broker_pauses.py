"""``purgatory bench kafka``'s account of its broker's stop-the-world pauses (``broker_pauses.py``):
the JVM's safepoint log is parsed into pauses on the monotonic clock, and a slow record counts as
hit when a pause fell while it was in flight; the bench's broker profiles pass the launcher's
option check and a bad ``--broker-profile`` is refused by name. No Kafka: log lines as the JVM
writes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from purgatory.tools.bench.kafka.broker_pauses import (
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
    from purgatory.adapters.kafka.local._node import checked_jvm_options as _checked_jvm_options
    from purgatory.tools.bench.kafka.feed import BROKER_PROFILES, STEADY_STATE_PROFILE

    for name, profile in BROKER_PROFILES.items():
        assert _checked_jvm_options(profile.jvm_options) == profile.jvm_options, name
    assert "-XX:TieredStopAtLevel=1" not in STEADY_STATE_PROFILE.jvm_options, "steady state: C2 too"
    assert "-XX:MaxTenuringThreshold=1" in STEADY_STATE_PROFILE.jvm_options, "survivors promoted at once"
    assert f"-Xms{STEADY_STATE_PROFILE.heap_mb}m" in STEADY_STATE_PROFILE.jvm_options, (
        "heap fixed at its maximum"
    )


def test_an_unknown_broker_profile_is_refused_naming_it_before_any_cluster_starts() -> None:
    import typer
    from purgatory.tools.bench.kafka.feed import kafka
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(kafka)
    result = CliRunner().invoke(app, ["--broker-profile", "turbo"])
    assert result.exit_code == 2, result.output
    assert "turbo" in result.output and "steady" in result.output, result.output


def test_summarize_splits_the_window_pauses_by_cause_longest_total_first() -> None:
    ms = 1_000_000
    pauses = [
        BrokerPause(100 * ms, 120 * ms, "GenCollectForAllocation"),
        BrokerPause(130 * ms, 133 * ms, "Cleanup"),
        BrokerPause(140 * ms, 141 * ms + ms // 2, "ICBufferFull"),
        BrokerPause(200 * ms, 215 * ms, "GenCollectForAllocation"),
        BrokerPause(250 * ms, 250 * ms + ms // 10, "Cleanup"),  # under min_ms: not counted
    ]
    summary = summarize(pauses, (0, 300 * ms), slow=[])
    assert summary.by_cause == (
        ("GenCollectForAllocation", 2, pytest.approx(35.0)),
        ("Cleanup", 1, pytest.approx(3.0)),
        ("ICBufferFull", 1, pytest.approx(1.5)),
    )
    assert summary.describe_causes() == (
        "GenCollectForAllocation 2x 35 ms, Cleanup 1x 3 ms, ICBufferFull 1x 2 ms"
    )


def test_gc_log_option_is_one_word_on_the_safepoint_log_clock(tmp_path: Path) -> None:
    from purgatory.tools.bench.kafka.broker_pauses import gc_log_option

    option = gc_log_option(tmp_path / "gc.log")
    assert option.startswith("-Xlog:gc,gc+age=trace,gc+cpu:file=") and option.endswith(":uptime,timenanos")
    assert " " not in option


def test_a_broker_profile_spec_adds_jvm_options_and_broker_settings_to_its_base() -> None:
    from purgatory.adapters.kafka.local._node import checked_jvm_options as _checked_jvm_options
    from purgatory.tools.bench.kafka.feed import STEADY_STATE_PROFILE, parse_broker_profile

    assert parse_broker_profile("steady") == STEADY_STATE_PROFILE
    profile = parse_broker_profile("steady,-XX:GuaranteedSafepointInterval=0,num.io.threads=2")
    assert profile.jvm_options == (*STEADY_STATE_PROFILE.jvm_options, "-XX:GuaranteedSafepointInterval=0")
    assert profile.broker_config == {**STEADY_STATE_PROFILE.broker_config, "num.io.threads": "2"}
    assert profile.heap_mb == STEADY_STATE_PROFILE.heap_mb
    assert _checked_jvm_options(profile.jvm_options) == profile.jvm_options


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("turbo,-XX:+AlwaysPreTouch", "'turbo'"),
        ("steady,-Xmx4g", "'-Xmx4g'"),
        ("steady,AlwaysPreTouch", "'AlwaysPreTouch'"),
        ("steady,=1", "'=1'"),
    ],
)
def test_a_bad_broker_profile_spec_is_refused_naming_the_item(spec: str, named: str) -> None:
    from purgatory.tools.bench.kafka.feed import parse_broker_profile

    with pytest.raises(ValueError, match="--broker-profile") as error:
        parse_broker_profile(spec)
    assert named in str(error.value)


def test_a_bad_floor_mode_is_refused_naming_it_before_any_cluster_starts() -> None:
    import typer
    from purgatory.tools.bench.kafka.feed import kafka
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(kafka)
    result = CliRunner().invoke(app, ["--floor", "sideways"])
    assert result.exit_code == 2, result.output
    assert "sideways" in result.output and "alternate" in result.output, result.output


# Lines of a real ``gc_log_option`` log (JDK 17, SerialGC): a full collection, then a young one
# with its age table and CPU line, and a line of another collection torn off.
GC_LOG = (
    "[2.808s][71285000222315ns] GC(0) Pause Full (Metadata GC Threshold) 110M->8M(947M) 53.544ms\n"
    "[45.640s][71327832807025ns] GC(6) Desired survivor size 40239104 bytes, new threshold 1 "
    "(max threshold 1)\n"
    "[45.640s][71327832835206ns] GC(6) Age table with threshold 1 (max threshold 1)\n"
    "[45.640s][71327832840815ns] GC(6) - age   1:    1317360 bytes,    1317360 total\n"
    "[45.640s][71327832840816ns] GC(6) - age   2:     100000 bytes,    1417360 total\n"
    "[45.640s][71327832919242ns] GC(6) Pause Young (Allocation Failure) 789M->176M(947M) 53.973ms\n"
    "[45.640s][71327832919300ns] GC(6) User=0.01s Sys=0.00s Real=0.05s\n"
    "[48.000s][71330000000000ns] GC(7) Pause Young (Allocation"
)


def test_read_collections_joins_each_pause_with_its_survivors_and_cpu() -> None:
    from purgatory.tools.bench.kafka.broker_pauses import Collection, read_collections

    assert read_collections(GC_LOG) == [
        Collection(71285000222315, "Full", "Metadata GC Threshold", 53.544, 0, 0.0),
        Collection(71327832919242, "Young", "Allocation Failure", 53.973, 1417360, pytest.approx(10.0)),
    ], "the last age line's total is what the pause copied; a torn line is skipped"
