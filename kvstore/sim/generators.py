"""Seeded workload generators in the Mooncake JSONL shape: chat, agent loops, RAG, scan bursts, tenant mixes,
and two families built so that ARC (`hotscan`) and S3-FIFO (`onehit`) lead the classic policies.

Every generator returns rows {"timestamp" (ms), "input_length", "output_length" (tokens), "hash_ids"}
with 512-token blocks chained along the prefix, as in the Mooncake release: two requests share
block i exactly when they share the first 512 * (i + 1) prompt tokens, and a prompt's partly filled
last block gets a fresh id (its content changes when the prompt grows). The same seed gives the
same rows. `rows_to_trace` makes them a `Trace` for `kvstore replay`; `write_jsonl` writes the file.

Families (what each one stresses):

* `chat`: multi-turn conversations behind one shared system prompt. Session starts follow the
  Azure conversation trace's request inter-arrival deciles (scaled by the mean number of turns),
  first prompts and answers its ContextTokens/GeneratedTokens deciles. The Azure trace has no
  session ids, so the number of turns (geometric, mean `mean_turns`) and the think time between
  turns (exponential, mean `think_s`) are assumptions. Each turn re-sends the history plus the
  answer and a new user message (a quarter of an Azure prompt).
* `agent`: tool loops. Each agent shares a tool/system prefix with all others, then re-reads its
  whole context every few seconds (`step_s`), growing it by a tool result and a short answer.
* `rag`: a shared system prompt, one of `num_docs` documents drawn Zipf(`zipf`) by popularity,
  and a unique query suffix.
* `scan`: RAG traffic interrupted every `burst_every_s` by a burst of one-shot long prompts
  that flood the cache (batch jobs, document ingestion).
* `mix`: tenants with different reuse distances (chat with long think times, agents re-reading
  every few seconds, RAG over a large corpus, scan bursts), each in its own id space, merged
  by time.
* `hotscan`: frequency-skewed reuse with scans, built so that ARC leads the classics at small
  capacities: Zipf-popular documents, each request followed by 1-4 turns a few seconds apart
  (a first reuse at a medium distance, past S3-FIFO's small queue but inside ARC's T1), and
  bursts of one-shot long prompts that flood LRU.
* `onehit`: a one-hit-heavy stream, built so that S3-FIFO leads: three requests in four are
  one-shot prompts behind a short system prompt, the rest re-read a Zipf set of prefixes.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypedDict

from kvstore.errors import ConfigError
from kvstore.sim.trace import Trace, TraceRequest

logger = logging.getLogger(__name__)

BLOCK_TOKENS = 512


class Row(TypedDict):
    """One request in the Mooncake JSONL shape."""

    timestamp: float  # ms from the start
    input_length: int  # prompt tokens
    output_length: int  # generated tokens
    hash_ids: list[int]  # one id per 512-token block of the prompt, chained along the prefix


# Deciles (0, 10, ..., 100%) of azure_conv_2023.csv (Azure LLM inference trace 2023, conversation,
# 19,366 rows, CC-BY 4.0), from `azure_deciles(path)`; the generators need no file.
AZURE_CONV_CONTEXT_TOKENS = (2, 207, 387, 403, 703, 1020, 1071, 1130, 1315, 2734, 14050)
AZURE_CONV_GENERATED_TOKENS = (7, 54, 77, 91, 103, 129, 177, 384, 400, 424, 1000)
AZURE_CONV_GAP_S = (0.0, 0.016, 0.037, 0.061, 0.087, 0.118, 0.159, 0.214, 0.289, 0.421, 4.315)


def sample_deciles(rng: random.Random, deciles: tuple[float, ...]) -> float:
    """A draw from the distribution the deciles describe (linear between them)."""
    u = rng.random() * (len(deciles) - 1)
    i = min(int(u), len(deciles) - 2)
    return deciles[i] + (u - i) * (deciles[i + 1] - deciles[i])


def azure_deciles(path: Path | str) -> dict[str, tuple[float, ...]]:
    """Deciles of an Azure LLM trace CSV: context tokens, generated tokens, inter-arrival gap (s)."""
    import csv
    from datetime import datetime

    with Path(path).open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    stamps = [datetime.fromisoformat(r["TIMESTAMP"].strip()[:26]).timestamp() for r in rows]

    def deciles(values: list[float]) -> tuple[float, ...]:
        values = sorted(values)
        return tuple(values[min(len(values) - 1, round(i * (len(values) - 1) / 10))] for i in range(11))

    return {"context": deciles([int(r["ContextTokens"]) for r in rows]),
            "generated": deciles([int(r["GeneratedTokens"]) for r in rows]),
            "gap_s": tuple(round(g, 3) for g in deciles([b - a for a, b in zip(stamps, stamps[1:])]))}


class Context:
    """A prompt that grows: its full blocks keep their ids, a partial tail gets a fresh id per request."""

    def __init__(self, ids: Iterator[int], tokens: int = 0, full: list[int] | None = None) -> None:
        self._ids = ids
        self.tokens = tokens
        self.full = list(full or [])

    def extend(self, num_tokens: float) -> Context:
        self.tokens += max(0, int(num_tokens))
        while self.tokens >= (len(self.full) + 1) * BLOCK_TOKENS:
            self.full.append(next(self._ids))
        return self

    def fork(self) -> Context:
        """A context that starts with this one's prefix (same ids) and grows on its own."""
        return Context(self._ids, self.tokens, self.full)

    def row(self, timestamp_ms: float, output_tokens: int) -> Row:
        tail = [next(self._ids)] if self.tokens % BLOCK_TOKENS else []
        return {"timestamp": round(timestamp_ms, 3), "input_length": self.tokens,
                "output_length": int(output_tokens), "hash_ids": [*self.full, *tail]}


def chat(seed: int = 0, *, num_sessions: int = 500, mean_turns: float = 4.0, think_s: float = 60.0,
         system_tokens: int = 1100, id_base: int = 0) -> list[Row]:
    """Multi-turn chat sessions (see the module docstring)."""
    rng, ids = random.Random(seed), itertools.count(id_base)
    system = Context(ids).extend(system_tokens)
    rows: list[Row] = []
    start_s = 0.0
    for _ in range(num_sessions):
        start_s += sample_deciles(rng, AZURE_CONV_GAP_S) * mean_turns
        context = system.fork().extend(sample_deciles(rng, AZURE_CONV_CONTEXT_TOKENS))
        at_s = start_s
        while True:
            answer = int(sample_deciles(rng, AZURE_CONV_GENERATED_TOKENS))
            rows.append(context.row(at_s * 1000.0, answer))
            if rng.random() < 1.0 / mean_turns:
                break
            at_s += rng.expovariate(1.0 / think_s)
            context.extend(answer + sample_deciles(rng, AZURE_CONV_CONTEXT_TOKENS) / 4)
    return _by_time(rows)


def agent(seed: int = 0, *, num_agents: int = 80, arrival_s: float = 8.0, steps: tuple[int, int] = (8, 40),
          step_s: float = 3.0, tool_tokens: int = 4000, task_tokens: tuple[int, int] = (500, 4000),
          id_base: int = 0) -> list[Row]:
    """Agent/tool loops: a long context re-read every `step_s` seconds on average, growing by small steps."""
    rng, ids = random.Random(seed), itertools.count(id_base)
    tools = Context(ids).extend(tool_tokens)
    rows: list[Row] = []
    start_s = 0.0
    for _ in range(num_agents):
        start_s += rng.expovariate(1.0 / arrival_s)
        context = tools.fork().extend(rng.randint(*task_tokens))
        at_s = start_s
        for _ in range(rng.randint(*steps)):
            answer = rng.randint(20, 200)
            rows.append(context.row(at_s * 1000.0, answer))
            at_s += rng.expovariate(1.0 / step_s)
            context.extend(answer + rng.randint(50, 600))  # the call it made and the tool's result
    return _by_time(rows)


def rag(seed: int = 0, *, num_requests: int = 3000, num_docs: int = 2000, zipf: float = 1.0, rps: float = 5.0,
        system_tokens: int = 1536, doc_tokens: tuple[int, int] = (800, 4000), id_base: int = 0) -> list[Row]:
    """RAG: shared system prompt + a Zipf-popular document + a unique query."""
    rng, ids = random.Random(seed), itertools.count(id_base)
    system = Context(ids).extend(system_tokens)
    docs: dict[int, Context] = {}
    cumulative = list(itertools.accumulate(1.0 / (rank + 1) ** zipf for rank in range(num_docs)))
    order = list(range(num_docs))
    rng.shuffle(order)  # popularity rank -> document
    rows: list[Row] = []
    at_s = 0.0
    for _ in range(num_requests):
        at_s += rng.expovariate(rps)
        rank = bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
        doc = order[min(rank, num_docs - 1)]
        if doc not in docs:
            docs[doc] = system.fork().extend(rng.randint(*doc_tokens))
        rows.append(docs[doc].fork().extend(rng.randint(30, 400)).row(at_s * 1000.0, rng.randint(50, 400)))
    return rows


def scan(seed: int = 0, *, duration_s: float = 600.0, burst_every_s: float = 60.0, burst_requests: int = 12,
         burst_tokens: tuple[int, int] = (8192, 32768), id_base: int = 0) -> list[Row]:
    """RAG traffic with bursts of one-shot long prompts (never seen again) every `burst_every_s`."""
    rng, ids = random.Random(seed), itertools.count(id_base + (1 << 36))
    rows = [r for r in rag(seed, num_requests=int(duration_s * 4), num_docs=400, rps=4.0, id_base=id_base)]
    at_s = burst_every_s / 2
    while at_s < duration_s:
        for i in range(burst_requests):
            one_shot = Context(ids).extend(rng.randint(*burst_tokens))
            rows.append(one_shot.row((at_s + i * 0.1) * 1000.0, rng.randint(10, 100)))
        at_s += burst_every_s
    return _by_time(rows)


def mix(seed: int = 0, *, id_stride: int = 1 << 40) -> list[Row]:
    """Four tenants with different reuse distances, each in its own id space, merged by time."""
    tenants = [
        chat(seed, num_sessions=150, think_s=120.0, id_base=1 * id_stride),
        agent(seed + 1, num_agents=25, arrival_s=20.0, step_s=2.0, id_base=2 * id_stride),
        rag(seed + 2, num_requests=1200, num_docs=3000, zipf=0.8, rps=2.0, id_base=3 * id_stride),
        scan(seed + 3, duration_s=600.0, burst_every_s=90.0, burst_requests=6, id_base=4 * id_stride),
    ]
    return _by_time([row for rows in tenants for row in rows])


def hotscan(seed: int = 0, *, num_requests: int = 4000, num_docs: int = 600, zipf: float = 0.9, rps: float = 4.0,
            turns: tuple[int, int] = (1, 4), turn_gap_s: tuple[float, float] = (1.0, 6.0),
            burst_every_s: float = 20.0, burst_requests: int = 8, burst_tokens: tuple[int, int] = (4096, 16384),
            system_tokens: int = 1024, doc_tokens: tuple[int, int] = (1024, 4096), id_base: int = 0) -> list[Row]:
    """Frequency-skewed reuse with scans: Zipf documents re-read over turns seconds apart, one-shot bursts."""
    rng, ids, system, popular = _popular_start(seed, id_base, system_tokens, num_docs, zipf)
    docs: dict[int, Context] = {}
    rows: list[Row] = []
    at_s = 0.0
    for _ in range(num_requests):
        at_s += rng.expovariate(rps)
        doc = popular()
        if doc not in docs:
            docs[doc] = system.fork().extend(rng.randint(*doc_tokens))
        context, turn_s = docs[doc].fork().extend(rng.randint(30, 400)), at_s
        for _ in range(rng.randint(*turns)):
            rows.append(context.row(turn_s * 1000.0, 100))
            turn_s += rng.uniform(*turn_gap_s)
            context.extend(rng.randint(100, 600))
    burst_s = burst_every_s / 2
    while burst_s < at_s:
        for i in range(burst_requests):
            rows.append(Context(ids).extend(rng.randint(*burst_tokens)).row((burst_s + i * 0.05) * 1000.0, 10))
        burst_s += burst_every_s
    return _by_time(rows)


def onehit(seed: int = 0, *, num_requests: int = 6000, one_hit_share: float = 0.75, num_hot: int = 300,
           zipf: float = 0.8, rps: float = 6.0, one_hit_tokens: tuple[int, int] = (512, 4096),
           hot_tokens: tuple[int, int] = (1024, 4096), system_tokens: int = 512, id_base: int = 0) -> list[Row]:
    """One-hit-heavy stream: most prompts never return; the rest re-read a Zipf set of prefixes."""
    rng, ids, system, popular = _popular_start(seed, id_base, system_tokens, num_hot, zipf)
    hot: dict[int, Context] = {}
    rows: list[Row] = []
    at_s = 0.0
    for _ in range(num_requests):
        at_s += rng.expovariate(rps)
        if rng.random() < one_hit_share:
            rows.append(system.fork().extend(rng.randint(*one_hit_tokens)).row(at_s * 1000.0, 50))
            continue
        k = popular()
        if k not in hot:
            hot[k] = system.fork().extend(rng.randint(*hot_tokens))
        rows.append(hot[k].fork().extend(rng.randint(30, 300)).row(at_s * 1000.0, 50))
    return rows


def _popular_start(seed: int, id_base: int, system_tokens: int, num_items: int,
                   zipf: float) -> tuple[random.Random, Iterator[int], Context, Callable[[], int]]:
    """A Zipf-popularity generator's start: its random stream, token ids, the shared system prompt, the picker."""
    rng, ids = random.Random(seed), itertools.count(id_base)
    system = Context(ids).extend(system_tokens)
    return rng, ids, system, _zipf_picker(rng, num_items, zipf)


def _zipf_picker(rng: random.Random, num_items: int, zipf: float) -> Callable[[], int]:
    """Draws item ids 0..num_items-1 by Zipf(`zipf`) popularity, the popularity ranks shuffled."""
    cumulative = list(itertools.accumulate(1.0 / (rank + 1) ** zipf for rank in range(num_items)))
    order = list(range(num_items))
    rng.shuffle(order)
    return lambda: order[min(bisect.bisect_left(cumulative, rng.random() * cumulative[-1]), num_items - 1)]


def _by_time(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: r["timestamp"])


GENERATORS: dict[str, Callable[..., list[Row]]] = {"chat": chat, "agent": agent, "rag": rag, "scan": scan, "mix": mix,
                                                   "hotscan": hotscan, "onehit": onehit}


def generate(family: str, seed: int = 0) -> list[Row]:
    """Rows of the named family with its default parameters."""
    if family not in GENERATORS:
        raise ConfigError(f"unknown workload family {family!r}; valid: {', '.join(GENERATORS)}")
    return GENERATORS[family](seed)


def rows_to_trace(name: str, rows: list[Row]) -> Trace:
    requests = [TraceRequest(r["timestamp"], r["input_length"], tuple(r["hash_ids"])) for r in rows]
    return Trace(name, requests, BLOCK_TOKENS)


def write_jsonl(rows: list[Row], path: Path | str) -> None:
    with Path(path).open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
