"""Trace files as block-id traces: an Azure CSV under a stated reuse model, or a Mooncake JSONL.

Azure CSV reuse model (the trace has no prefix ids; this is an assumption, stated in the output):
    each request joins one of `sessions` conversations, drawn uniformly with a fixed seed; it
    shares with the previous request of its conversation its first floor(repeat_share * prompt /
    block_tokens) blocks (at most the full blocks that request had); the rest are new.

Both the replay suite (`kvstore.sim.suite`) and the planner (`kvstore.plan`) read traces here, so the
simulator does not depend on the planner.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from kvstore.errors import ConfigError
from kvstore.sim.trace import Trace, TraceRequest, load_mooncake

AZURE_REUSE_MODEL = ("Azure CSV has no prefix ids: each request joins one of {sessions} conversations at random and "
                     "shares its first floor({repeat_share} * prompt / {block_tokens}) blocks with that "
                     "conversation's previous request")


def load_trace(path: str | Path, *, block_tokens: int, sessions: int = 1000, repeat_share: float = 0.5,
               seed: int = 0) -> tuple[Trace, str]:
    """A trace file as a Trace plus a line describing how its block ids were obtained."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        note = AZURE_REUSE_MODEL.format(sessions=sessions, repeat_share=repeat_share, block_tokens=block_tokens)
        return load_azure_csv(path, block_tokens=block_tokens, sessions=sessions, repeat_share=repeat_share, seed=seed), note
    trace = load_mooncake(path)
    return trace, f"Mooncake hash_ids, {trace.block_tokens}-token blocks"


def _fresh_ids(counter: Iterator[int], num: int) -> tuple[int, ...]:
    return tuple(next(counter) for _ in range(num))


def load_azure_csv(path: Path, *, block_tokens: int, sessions: int, repeat_share: float, seed: int = 0) -> Trace:
    """Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens) under the reuse model above."""
    rows: list[tuple[float, int]] = []
    try:
        with path.open(newline="") as fh:
            for line_no, row in enumerate(csv.DictReader(fh), 2):
                rows.append(_azure_row(row, line_no, path))
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}") from exc
    rng = random.Random(seed)
    counter = itertools.count()
    last_blocks: dict[int, tuple[int, ...]] = {}
    start = rows[0][0] if rows else 0.0
    requests = []
    for timestamp_s, prompt in rows:
        session = rng.randrange(sessions)
        previous = last_blocks.get(session, ())
        shared = min(math.floor(repeat_share * prompt / block_tokens), len(previous))
        blocks = previous[:shared] + _fresh_ids(counter, math.ceil(prompt / block_tokens) - shared)
        last_blocks[session] = blocks[: prompt // block_tokens]
        requests.append(TraceRequest((timestamp_s - start) * 1000.0, prompt, blocks))
    requests.sort(key=lambda r: r.timestamp)
    return Trace(path.name, requests, block_tokens)


def _azure_row(row: dict[str, str], line_no: int, path: Path) -> tuple[float, int]:
    try:
        stamp = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
        return stamp.timestamp(), int(row["ContextTokens"])
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path}:{line_no}: not an Azure trace row ({exc!r}); expected "
                          "TIMESTAMP,ContextTokens,GeneratedTokens") from exc
