"""SharedAnswers: a finished long poll's answer rendered once per operation, for every protocol."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st
from purgatory.adapters.kafka import DelayedFetch, ErrorCode, FetchedRecord, PartitionRead, TopicPartitionKey
from purgatory.adapters.service.answers import _shared
from purgatory.adapters.service.answers._shared import SharedAnswers, fetch_body

from purgatory import Outcome

KEY = TopicPartitionKey("orders", 0)


@dataclass(slots=True)
class AnsweredFetch:
    """The fields of a finished DelayedFetch that its answer is rendered from (no slot for its
    shared answer: rendered per call, as an operation of another kind is)."""

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


@dataclass(slots=True)
class SlottedFetch(AnsweredFetch):
    """As the service's OffLoopFetch: a slot for the answer its waiters share."""

    shared_answer: object = None


def _record(offset: int, value: bytes = b"v") -> FetchedRecord:
    return FetchedRecord(offset, None, value, 1_700_000_000_000)


def _op(records: list[FetchedRecord], **fields: Any) -> DelayedFetch:
    return cast(DelayedFetch, SlottedFetch({KEY: records}, **fields))


def test_every_waiter_of_one_operation_shares_its_body() -> None:
    shared = SharedAnswers()
    op = _op([_record(0), _record(1, b"\xff")])
    first = shared.body("orders", 0, op)
    assert all(shared.body("orders", 0, op) is first for _ in range(5))
    assert shared.rendered == 1 and shared.hits == 5
    body: Any = json.loads(first)
    assert body["outcome"] == "COMPLETED" and body["next_offset"] == 2 and body["fetch_offset"] == 0
    assert body["records"][0]["value"] == "v" and body["records"][1]["value_b64"] == "/w=="
    assert first == fetch_body("orders", 0, op), "the shared body is the waiter's own answer"


def test_other_operations_render_their_own_answers() -> None:
    shared = SharedAnswers()
    records = [_record(5)]
    completed, expired = _op(records), _op(records, outcome=Outcome.EXPIRED, fetch_offsets={KEY: 5})
    bodies = [json.loads(shared.body("orders", 0, op)) for op in (completed, expired)]
    assert [b["outcome"] for b in bodies] == ["COMPLETED", "EXPIRED"]
    assert [b["fetch_offset"] for b in bodies] == [0, 5]
    assert shared.rendered == 2 and shared.hits == 0


def test_operations_of_different_groups_answering_the_same_records_list_share_the_last_body() -> None:
    """A catching-up consumer's polls complete in groups of their own (the records are there), each
    answering the record cache's one list: the last body is theirs too, not a render each."""
    shared = SharedAnswers()
    records = [_record(0), _record(1)]
    first = shared.body("orders", 0, _op(records))
    assert shared.body("orders", 0, _op(records)) is first and shared.rendered == 1
    assert shared.body("orders", 0, _op(list(records))) is first, "another list of the same records"
    assert shared.of("orders", 0, _op(records)) is shared.of("orders", 0, _op(records)), "encodings too"
    equal_not_same = shared.body("orders", 0, _op([_record(0), _record(1)]))
    assert equal_not_same == first and equal_not_same is not first and shared.rendered == 2


def test_only_the_last_body_outlives_its_operation() -> None:
    shared = SharedAnswers()
    records = [_record(0)]
    op = cast(DelayedFetch, AnsweredFetch({KEY: records}))  # no slot: nothing kept on it
    first = shared.body("orders", 0, op)
    assert shared.body("orders", 0, op) is first, "the last body"
    shared.body("orders", 0, _op([_record(7)]))  # another answer is the last one now
    again = shared.body("orders", 0, op)
    assert again == first and again is not first and shared.rendered == 3
    assert shared.last is not None and shared.last[0] is records, "one answer kept: the last rendered"


def test_each_protocols_encoding_is_made_once_per_default_headers() -> None:
    shared = SharedAnswers()
    answer = shared.of("orders", 0, _op([_record(0)]))
    today, tomorrow = [(b"date", b"today")], [(b"date", b"tomorrow")]
    made: list[bytes] = []

    def encode(body: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        made.append(body)
        return headers[0][1] + body

    h11 = [answer.http11(today, encode) for _ in range(3)]
    assert h11[0] is h11[1] is h11[2] and len(made) == 1
    assert answer.http11(tomorrow, encode).startswith(b"tomorrow") and len(made) == 2
    assert answer.http2(today, encode) is answer.http2(today, encode) and len(made) == 3


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
    with patch.object(_shared, "RENDER_GROUP_BYTES", group_bytes):
        grouped = _shared.fetch_body("orders", 0, op)
    assert grouped == _shared._json_bytes(_shared._fetch_json("orders", 0, op))


def test_a_released_body_is_forgotten_and_rendered_again_by_the_next_operation() -> None:
    shared = SharedAnswers()
    records = [_record(0), _record(1)]
    first = shared.body("orders", 0, _op(records))
    shared.forget(b"another body")  # not the last one: kept
    assert shared.body("orders", 0, _op(records)) is first
    shared.forget(first)
    assert shared.last is None, "no cache keeps a released body"
    assert shared.body("orders", 0, _op(records)) is not first and shared.rendered == 2


def test_a_released_large_body_leaves_its_operation_too() -> None:
    """An operation may outlive its last writer for a while: on release it lets go of the body."""
    shared = SharedAnswers()
    op = _op([_record(0, b"x" * (_shared.LARGE_BODY + 1))])
    body = shared.body("orders", 0, op)
    assert cast(Any, op).shared_answer is not None
    shared.forget(body)
    assert cast(Any, op).shared_answer is None and shared.last is None
    assert shared.body("orders", 0, op) == body, "a later waiter renders it again"
