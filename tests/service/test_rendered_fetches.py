"""RenderedFetches: a long-poll answer rendered once and shared by every waiter answered the same."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st
from purgatory.adapters.kafka import DelayedFetch, ErrorCode, FetchedRecord, PartitionRead, TopicPartitionKey
from purgatory.adapters.service.answers import _render
from purgatory.adapters.service.answers._render import RenderedFetches, _fetch_json

from purgatory import Outcome

KEY = TopicPartitionKey("orders", 0)


@dataclass
class AnsweredFetch:
    """The fields of a finished DelayedFetch that its answer is rendered from."""

    records: dict[TopicPartitionKey, list[FetchedRecord]]
    fetch_offsets: dict[TopicPartitionKey, int] = field(default_factory=lambda: {KEY: 0})
    statuses: dict[TopicPartitionKey, ErrorCode] = field(default_factory=lambda: {KEY: ErrorCode.NONE})
    outcome: Outcome | None = Outcome.COMPLETED
    error: Exception | None = None

    @property
    def parts(self) -> tuple[PartitionRead, ...]:
        parts = []
        for key, offset in self.fetch_offsets.items():
            part = PartitionRead(key, offset)
            part.records, part.status = self.records[key], self.statuses[key]
            parts.append(part)
        return tuple(parts)


def _answered(records: list[FetchedRecord]) -> DelayedFetch:
    # A finished op's list: each waiter gets its own list of the shared cache's record objects.
    return cast(DelayedFetch, AnsweredFetch({KEY: list(records)}))


def _record(offset: int, value: bytes = b"v") -> FetchedRecord:
    return FetchedRecord(offset, None, value, 1_700_000_000_000)


def test_waiters_answered_with_the_same_records_share_one_body() -> None:
    rendered = RenderedFetches()
    shared = [_record(0), _record(1)]
    first = rendered.body("orders", 0, _answered(shared))
    second = rendered.body("orders", 0, _answered(shared))
    assert second is first, "the second waiter's answer is the bytes rendered for the first"
    assert rendered.hits == 1
    body: Any = json.loads(first)
    assert body == _fetch_json("orders", 0, _answered(shared)), "the shared body is the waiter's own answer"


def test_equal_but_distinct_records_are_rendered_for_their_own_waiter() -> None:
    rendered = RenderedFetches()
    rendered.body("orders", 0, _answered([_record(0, b"a")]))
    other = rendered.body("orders", 0, _answered([_record(0, b"b")]))  # same offset, other record
    assert json.loads(other)["records"][0]["value"] == "b"
    assert rendered.hits == 0


def test_answers_differing_in_outcome_or_offset_are_not_shared() -> None:
    rendered = RenderedFetches()
    shared = [_record(5)]
    completed = _answered(shared)
    expired = cast(DelayedFetch, AnsweredFetch({KEY: list(shared)}, outcome=Outcome.EXPIRED))
    later = cast(DelayedFetch, AnsweredFetch({KEY: list(shared)}, fetch_offsets={KEY: 5}))
    bodies = [json.loads(rendered.body("orders", 0, op)) for op in (completed, expired, later)]
    assert [b["outcome"] for b in bodies] == ["COMPLETED", "EXPIRED", "COMPLETED"]
    assert [b["fetch_offset"] for b in bodies] == [0, 0, 5]
    assert rendered.hits == 0


def test_rendered_bodies_are_bounded_by_count_and_bytes() -> None:
    rendered = RenderedFetches(max_entries=2, max_bytes=4_000)
    batches = [[_record(i)] for i in range(3)]
    for batch in batches:
        rendered.body("orders", 0, _answered(batch))
    rendered.body("orders", 0, _answered(batches[0]))
    assert rendered.hits == 0, "the oldest of three was dropped at a bound of two"
    big = [_record(0, b"x" * 2_000)]  # more than a quarter of the byte bound: rendered, not kept
    rendered.body("orders", 0, _answered(big))
    rendered.body("orders", 0, _answered(batches[1]))  # another answer is the last one now
    rendered.body("orders", 0, _answered(big))
    assert rendered.hits == 0


def test_the_same_records_in_another_list_are_the_last_answer_again() -> None:
    """Reads that reached the record cache's end make lists of their own of the same records: a
    body too large for the LRU is still not rendered again for them (~18 MB each, measured)."""
    rendered = RenderedFetches(max_entries=2, max_bytes=4_000)
    big = [_record(0, b"x" * 2_000), _record(1, b"y" * 2_000)]
    first = rendered.body("orders", 0, _answered(list(big)))
    again = rendered.body("orders", 0, _answered(list(big)))
    assert again is first and rendered.hits == 1
    other = rendered.body("orders", 0, _answered([big[0], _record(1, b"y" * 2_000)]))  # equal, not the same
    assert other is not first and rendered.hits == 1


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=20).map(str.encode)), max_size=30
    ),
    group_bytes=st.integers(min_value=1, max_value=64),
    error=st.one_of(st.none(), st.text(max_size=10)),
)
def test_a_body_rendered_in_groups_of_records_is_the_bytes_of_the_whole_answer_rendered_at_once(
    values: list[bytes | None], group_bytes: int, error: str | None
) -> None:
    records = [
        FetchedRecord(i, b"k" if i % 3 else None, value, 1_700_000_000_000 + i)
        for i, value in enumerate(values)
    ]
    op = cast(
        DelayedFetch, AnsweredFetch({KEY: records}, error=None if error is None else RuntimeError(error))
    )
    with patch.object(_render, "RENDER_GROUP_BYTES", group_bytes):
        grouped = _render._fetch_body("orders", 0, op)
    assert grouped == _render._json_bytes(_fetch_json("orders", 0, op))


def test_a_released_body_is_forgotten_and_rendered_again_by_the_next_waiter() -> None:
    rendered = RenderedFetches()
    shared = [_record(0), _record(1)]
    first = rendered.body("orders", 0, _answered(shared))
    other = rendered.body("orders", 0, _answered([_record(5)]))  # in the LRU, not the last answer
    rendered.forget(first)
    assert rendered.body("orders", 0, _answered(shared)) is not first, "no cache keeps a released body"
    rendered.forget(other)
    assert rendered.body("orders", 0, _answered([_record(5)])) is not other
    assert rendered.hits == 0
