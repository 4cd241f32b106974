"""The store index's compact map (KeyIndex, kvstore/csrc/key_index.c) against its twin, a dict: the same answers
through random changes, the same errors, values kept alive and collected, and its memory under turnover."""

from __future__ import annotations

import gc
import os
import random
import sys
import weakref
from collections.abc import MutableMapping
from typing import Any

import pytest

from kvstore import native_keys
from kvstore.key_table import key_map
from kvstore.store.index import ChunkIndex

NATIVE = native_keys.loaded()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="no C build of kvstore._chunk_keys (no C compiler at install)")


def _native() -> Any:
    assert NATIVE is not None
    return NATIVE.KeyIndex()


def test_the_store_index_uses_the_compact_map_when_built() -> None:
    assert type(key_map()).__name__ == "KeyIndex"
    assert type(ChunkIndex([])._entries).__name__ == "KeyIndex"


def test_key_index_answers_as_a_dict_through_random_changes() -> None:
    rng = random.Random(11)
    table, model = _native(), {}
    pool = [os.urandom(16) for _ in range(5000)] + [b"", b"short", os.urandom(40)]
    for step in range(60_000):
        key = rng.choice(pool)
        op = rng.random()
        if op < 0.45:
            value = object()
            table[key] = value
            model[key] = value
        elif op < 0.6:
            assert table.pop(key, None) is model.pop(key, None)
        elif op < 0.7:
            if key in model:
                del table[key]
                del model[key]
            else:
                with pytest.raises(KeyError):
                    del table[key]
        elif op < 0.8:
            assert table.get(key) is model.get(key) and table.get(key, 5) is model.get(key, 5)
        else:
            assert (key in table) == (key in model)
            assert (bytes(key) in table) == (key in model)  # equal bytes, another object
        if step % 4999 == 0:
            assert len(table) == len(model)
            assert sorted(table.keys()) == sorted(model) == sorted(table)
            assert {k: id(v) for k, v in table.items()} == {k: id(v) for k, v in model.items()}
            assert sorted(map(id, table.values())) == sorted(map(id, model.values()))
    for key in list(model):  # empty it: it compacts on the way down and works again
        del table[key]
    assert len(table) == 0 and table.keys() == [] and table.nbytes() < 4096
    table[b"k"] = 1
    assert table[b"k"] == 1 and len(table) == 1


def test_an_int_valued_key_index_answers_as_a_dict_of_ints_and_holds_no_int_objects() -> None:
    """The memory tiers' map: key -> a packed 64-bit int, unboxed (no object per key)."""
    assert NATIVE is not None
    rng = random.Random(5)
    table, model = NATIVE.KeyIndex(int_values=True), {}
    pool = [os.urandom(16) for _ in range(3000)]
    for step in range(30_000):
        key = rng.choice(pool)
        op = rng.random()
        if op < 0.5:
            value = rng.choice([0, -1, 2**63 - 1, -(2**63), rng.getrandbits(62)])
            table[key] = value
            model[key] = value
        elif op < 0.7:
            assert table.pop(key, None) == model.pop(key, None)
        elif op < 0.8 and key in model:
            del table[key]
            del model[key]
        else:
            assert table.get(key) == model.get(key) and (key in table) == (key in model)
        if step % 2999 == 0:
            assert dict(table.items()) == model and sorted(table.values()) == sorted(model.values())
    with pytest.raises(TypeError, match="holds int values, not str"):
        table[b"k"] = "text"
    with pytest.raises(OverflowError):
        table[b"k"] = 2**63
    assert b"k" not in table  # a refused value changes nothing
    n = 200_000
    gc.collect()
    before = sys.getallocatedblocks()
    big = NATIVE.KeyIndex(int_values=True)
    keys = [os.urandom(16) for _ in range(n)]
    for i, key in enumerate(keys):
        big[key] = i << 30
    assert sys.getallocatedblocks() - before < 1.01 * n + 1000  # the keys themselves, no value objects
    assert big.nbytes() / n < 40 and big[keys[7]] == 7 << 30


def test_key_index_refuses_what_a_dict_of_chunk_keys_would_not_hold() -> None:
    table = _native()
    with pytest.raises(TypeError, match="KeyIndex keys are bytes"):
        table["text"] = 1
    with pytest.raises(TypeError, match="KeyIndex keys are bytes"):
        table[bytearray(b"x")] = 1
    assert "text" not in table and 5 not in table and table.get(7) is None
    with pytest.raises(KeyError):
        table[b"absent"]
    with pytest.raises(KeyError):
        table.pop(b"absent")
    with pytest.raises(TypeError):
        type(table)(5)


def test_key_index_keeps_its_values_alive_and_lets_cycles_be_collected() -> None:
    class Value:
        pass

    table = _native()
    held = Value()
    ref = weakref.ref(held)
    table[b"a"] = held
    del held
    gc.collect()
    assert ref() is not None and table[b"a"] is ref()
    table[b"a"] = 1  # replaced: the old value goes
    assert ref() is None

    cyclic = Value()
    cyclic.table = table  # type: ignore[attr-defined]  # value -> table -> value
    table[b"b"] = cyclic
    ref = weakref.ref(cyclic)
    del cyclic, table
    gc.collect()
    assert ref() is None


def test_key_index_stays_compact_under_turnover_where_a_dict_triples() -> None:
    """300,000 keys held, then every one replaced: under 40 bytes a key, where the dict takes over 60."""
    n = 300_000
    table, model = _native(), dict[bytes, None]()
    keys = [os.urandom(16) for _ in range(n)]
    for key in keys:
        table[key] = None
        model[key] = None
    for i in range(n):
        del table[keys[i]]
        del model[keys[i]]
        keys[i] = os.urandom(16)
        table[keys[i]] = None
        model[keys[i]] = None
    assert len(table) == len(model) == n and all(k in table for k in keys)
    assert table.nbytes() / n < 40, table.nbytes() / n
    assert sys.getsizeof(model) / n > 60, sys.getsizeof(model) / n


@pytest.mark.parametrize("make", [dict, _native], ids=["dict", "KeyIndex"])
def test_both_twins_serve_the_index_interface(make: Any) -> None:
    """What kvstore/store/index.py calls, on either twin."""
    table: MutableMapping[bytes, int] = make()
    table[b"x"] = 1
    table[b"y"] = 2
    holds = table.__contains__
    get = table.get
    assert holds(b"x") and not holds(b"z") and get(b"y") == 2 and get(b"z") is None
    assert table.pop(b"x", None) == 1 and table.pop(b"x", None) is None
    del table[b"y"]
    assert len(table) == 0 and list(table.items()) == []
