"""Workloads for the engine demo and bench: Azure conversation arrivals and lengths, scaled to this machine,
with shared system prompts and multi-turn follow-ups so prefixes repeat."""

from __future__ import annotations

import csv
import logging
import os
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from connector.engine.llm_engine import TimedRequest
from connector.engine.sequence import SamplingParams
from kvstore.errors import ConfigError

logger = logging.getLogger(__name__)

AZURE_CONV = "azure_conv_2023.csv"


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float
    context_tokens: int
    generated_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadConfig:
    """How a slice of the trace becomes engine requests.

    Arrivals keep the trace's gaps, compressed to `requests_per_s` on average; prompt and output
    lengths are multiplied by `length_scale` and clipped. A request is a follow-up turn of an
    earlier conversation with probability `follow_up_prob` (its prompt = that conversation's last
    prompt + a reply + a new message); otherwise it opens a conversation on one of
    `num_system_prompts` shared system prompts.
    """

    num_requests: int = 48
    first_row: int = 0
    requests_per_s: float = 4.0
    length_scale: float = 0.25
    max_user_tokens: int = 384
    max_output_tokens: int = 48
    system_prompt_tokens: int = 256
    num_system_prompts: int = 4
    follow_up_prob: float = 0.4
    vocab_size: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.requests_per_s <= 0 or not 0 <= self.follow_up_prob <= 1:
            raise ConfigError("need num_requests >= 1, requests_per_s > 0 and 0 <= follow_up_prob <= 1")


BUNDLED_AZURE_CONV = Path(__file__).resolve().parent / "data" / "azure_conv_2023_head.csv"  # first 500 rows


def default_trace_dir() -> Path:
    """$KVSTORE_TRACE_DIR, else ../shared/traces beside the repository."""
    env = os.environ.get("KVSTORE_TRACE_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "traces"


def default_azure_trace() -> Path:
    """The full Azure conversation trace when it is there, else the 500-row slice shipped with kvstore."""
    full = default_trace_dir() / AZURE_CONV
    return full if full.exists() else BUNDLED_AZURE_CONV


def load_azure_conv(path: Path | None = None, *, first_row: int = 0, num_rows: int = 1000) -> list[TraceRow]:
    """Rows [first_row, first_row + num_rows) of the Azure conversation trace, arrivals from 0 s."""
    path = path or default_azure_trace()
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            raw = [row for i, row in enumerate(reader) if first_row <= i < first_row + num_rows]
    except OSError as exc:
        raise ConfigError(f"cannot read the Azure trace {path}: {exc}; pass --trace or set KVSTORE_TRACE_DIR") from exc
    if not raw:
        raise ConfigError(f"{path} has no rows from row {first_row}; lower first_row")
    stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in raw]
    return [TraceRow((t - stamps[0]).total_seconds(), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
            for t, r in zip(stamps, raw, strict=True)]


def spread_rows(rows: list[TraceRow], n: int) -> list[TraceRow]:
    """`n` rows evenly spaced over the whole trace (its length mix, not one slice's), arrivals in trace order."""
    if n >= len(rows):
        return rows
    step = len(rows) / n
    return [rows[int(i * step)] for i in range(n)]


def build_workload(rows: list[TraceRow], config: WorkloadConfig) -> list[TimedRequest]:
    """Engine requests from trace rows (see WorkloadConfig)."""
    rows = rows[: config.num_requests]
    rng = random.Random(config.seed)
    span = rows[-1].arrival_s or 1.0
    time_scale = (len(rows) / config.requests_per_s) / span
    systems = [_tokens(rng, config.system_prompt_tokens, config.vocab_size) for _ in range(config.num_system_prompts)]
    conversations: list[list[int]] = []
    requests = []
    for row in rows:
        user = _tokens(rng, _clip(row.context_tokens * config.length_scale, config.max_user_tokens), config.vocab_size)
        if conversations and rng.random() < config.follow_up_prob:
            i = rng.randrange(len(conversations))
            reply = _tokens(rng, _clip(row.generated_tokens * config.length_scale, config.max_output_tokens), config.vocab_size)
            conversations[i] = conversations[i] + reply + user
            prompt = conversations[i]
        else:
            prompt = rng.choice(systems) + user
            conversations.append(prompt)
        max_tokens = _clip(row.generated_tokens * config.length_scale, config.max_output_tokens)
        requests.append(TimedRequest(row.arrival_s * time_scale, prompt, SamplingParams(max_tokens=max_tokens)))
    return requests


def _clip(value: float, upper: int) -> int:
    return max(1, min(upper, round(value)))


def _tokens(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(n)]
