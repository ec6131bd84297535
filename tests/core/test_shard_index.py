"""shard_index: the native shard of a key is the one ``hash(key) % SHARDS`` names."""

from __future__ import annotations

import sys
from collections.abc import Hashable

import pytest

from purgatory._watchers import SHARDS, shard_index

KEYS: list[Hashable] = [
    0,
    1,
    -1,
    SHARDS,
    -SHARDS - 3,
    sys.maxsize,
    -sys.maxsize - 1,
    2**100,  # hashed modulo 2**61 - 1
    -(2**100),
    "fakeKey42",
    "",
    b"topic-0",
    ("topic", 3),
    3.5,
    -2.25,
    None,
]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_shard_index_is_hash_modulo_shards(key: Hashable) -> None:
    assert shard_index(key) == hash(key) % SHARDS, f"key {key!r} must land where hash % SHARDS puts it"


def test_shard_index_of_unhashable_key_raises_type_error() -> None:
    with pytest.raises(TypeError):
        shard_index([1, 2])  # type: ignore[arg-type]
