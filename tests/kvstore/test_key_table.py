"""KeyTable against a dict (and, ordered, an OrderedDict) through random puts, pops and moves; its memory."""

from __future__ import annotations

import os
import random
from collections import OrderedDict

import pytest

from kvstore.key_table import KeyTable


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("int_values", [False, True])
def test_key_table_agrees_with_a_dict_through_random_changes(ordered: bool, int_values: bool) -> None:
    rng = random.Random(7)
    table: KeyTable[int] = KeyTable(ordered=ordered, int_values=int_values)
    model: OrderedDict[bytes, int] = OrderedDict()
    pool = [os.urandom(16) for _ in range(3000)]
    for step in range(40_000):
        key = rng.choice(pool)
        op = rng.random()
        if op < 0.5:
            value = rng.randrange(1 << 40)
            table.put(key, value)
            model[key] = value  # a known key keeps its place in both
        elif op < 0.8:
            assert table.pop(key, -1) == model.pop(key, -1)
        else:
            assert table.move_to_end(key) == (key in model)
            if key in model:
                model.move_to_end(key)
        if step % 997 == 0:
            assert len(table) == len(model)
            assert all(table.get(k) == model.get(k) for k in pool)
            assert all((k in table) == (k in model) for k in pool)
            if ordered:
                assert table.keys() == list(model)
                assert list(table.items()) == list(model.items())
            else:
                assert sorted(table.items()) == sorted(model.items())
    assert len(table) == len(model)


def test_key_table_equal_hashes_are_told_apart_by_key() -> None:
    class Same:
        def __init__(self, n: int) -> None:
            self.n = n

        def __hash__(self) -> int:
            return 42

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Same) and other.n == self.n

    table: KeyTable[str] = KeyTable()
    keys = [Same(i) for i in range(50)]
    for i, key in enumerate(keys):
        table.put(key, str(i))
    for i in range(0, 50, 2):
        assert table.pop(Same(i)) == str(i)
    assert [table.get(Same(i)) for i in range(50)] == [None if i % 2 == 0 else str(i) for i in range(50)]


def test_an_emptied_table_gives_its_arrays_back_and_works_again() -> None:
    table: KeyTable[int] = KeyTable(ordered=True, int_values=True)
    keys = [os.urandom(16) for _ in range(5000)]
    for key in keys:
        table.put(key, 1)
    full = table.nbytes()
    for key in keys:
        table.pop(key)
    assert len(table) == 0 and table.nbytes() < full // 100
    table.put(keys[0], 5)
    assert table.get(keys[0]) == 5 and table.keys() == [keys[0]]


def test_key_table_stays_compact_under_turnover_where_a_dict_triples() -> None:
    """100,000 keys held, then every one replaced: the table's bytes per key stay under 48 (a dict's reach 80+)."""
    n = 100_000
    table: KeyTable[int] = KeyTable(ordered=True, int_values=True)
    plain: dict[bytes, int] = {}
    keys = [os.urandom(16) for _ in range(n)]
    for key in keys:
        table.put(key, 4096)
        plain[key] = 4096
    for i in range(n):
        table.pop(keys[i])
        del plain[keys[i]]
        keys[i] = os.urandom(16)
        table.put(keys[i], 4096)
        plain[keys[i]] = 4096
    assert len(table) == n == len(plain)
    assert table.nbytes() / n < 48, table.nbytes() / n
    assert plain.__sizeof__() / n > 60, plain.__sizeof__() / n  # what it replaces: a dict rebuilt with room for 3x
