"""`kvstore bench lookup` on a short prompt: every figure is measured on a lookup that found the whole prompt."""

from __future__ import annotations

import math
import random

from bench.lookup import TARGET_FIRST_MS, lookup_records


def test_the_lookup_bench_measures_every_figure_beside_its_peer() -> None:
    prompt = random.Random(1).choices(range(128_000), k=8 * 256)  # whole chunks, as the bench's prompt
    records = {r["metric"]: r for r in lookup_records(prompt, repeats=3)}
    assert {"lookup.first", "lookup.repeated", "lookup.list_keys", "lookup.first_vs_array"} <= set(records)
    assert records["lookup.first"]["baseline_value"] == TARGET_FIRST_MS
    assert records["lookup.list_keys"]["baseline"] == "keys of the tokens as an int32 array"
    for r in records.values():
        assert math.isfinite(r["value"]) and r["value"] > 0 and r["baseline_value"] > 0, r
