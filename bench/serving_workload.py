"""The multi-turn workloads of `kvstore bench serving`: sessions timed by the Mooncake trace or by LMCache's QA.

A session is a system prompt (shared by every session), a long context of its own, then turns: each turn's
prompt is everything so far (system + context + earlier messages and the model's answers) plus a new
message. When turns arrive comes from the trace: its conversations (a request whose block ids extend an
earlier request's, all but that request's last, partial block) give each session's first-turn time and the
gaps between its turns, multiplied by `time_scale` so an hour of trace fits a CPU run. Token counts are
ours: the trace's 7k-50k-token prompts do not fit a CPU prefill budget.

With `qps` set, turns arrive as in LMCache's multi-round QA benchmark instead (users x rounds, a shared system
prompt, a history per user, short answers): user i starts at i / qps and sends round r at r * num_users / qps
after that (so the users together send `qps` requests a second), or when its previous answer is in, if later.
bench.serving's QA workloads scale LMCache's sizes (1,000-token system prompt, 2,000 tokens of history per user,
100-token answers) down to what a 2-core CPU prefills in a run.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvstore.bundled import resolve_trace
from kvstore.errors import ConfigError

VOCAB_LOW, VOCAB_HIGH = 3, 1000  # token ids drawn from [3, 1000): clear of the special ids


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Sizes of the sessions (tokens) and how the trace's times are scaled."""

    num_sessions: int
    num_turns: int
    system_tokens: int
    context_tokens: int
    message_tokens: int
    answer_tokens: int
    time_scale: float = 0.01  # bench seconds per trace second
    trace: str = "mooncake-sample"
    qps: float | None = None  # LMCache's multi-round QA timing at this rate; None: the trace's times

    def __post_init__(self) -> None:
        if self.qps is not None and self.qps <= 0:
            raise ConfigError(f"Workload.qps must be positive, got {self.qps}; or None for the trace's times")

    @property
    def session_tokens(self) -> int:
        """Tokens one session holds after its last answer (the KV it would keep)."""
        return self.system_tokens + self.context_tokens + self.num_turns * (self.message_tokens + self.answer_tokens)

    @property
    def total_kv_tokens(self) -> int:
        """Distinct tokens of every session (the system prompt once)."""
        return self.system_tokens + self.num_sessions * (self.session_tokens - self.system_tokens)

    @property
    def longest_prompt_tokens(self) -> int:
        return self.session_tokens - self.answer_tokens


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation: its context (system prompt first), its messages, and when each turn arrives (s)."""

    context: list[int]
    messages: list[list[int]]
    arrivals_s: list[float]


def conversation_times(trace: str, num_sessions: int, num_turns: int) -> list[list[float]]:
    """Arrival times (trace seconds, from the trace start) of the first `num_sessions` conversations
    with at least `num_turns` turns, each cut to its first `num_turns` turns.

    Raises:
        ConfigError: the trace has fewer such conversations (the count is in the message).
    """
    requests = [json.loads(line) for line in Path(resolve_trace(trace)).read_text().splitlines() if line.strip()]
    next_turn: dict[int, int] = {}
    for later, request in enumerate(requests):
        blocks = request["hash_ids"]
        for earlier in range(later - 1, -1, -1):
            prior = requests[earlier]["hash_ids"]
            if earlier not in next_turn and len(prior) >= 3 and len(blocks) >= len(prior) \
                    and blocks[:len(prior) - 1] == prior[:-1]:
                next_turn[earlier] = later
                break
    continued = set(next_turn.values())
    sessions = []
    for first in (i for i in range(len(requests)) if i not in continued):
        turns = [first]
        while turns[-1] in next_turn and len(turns) < num_turns:
            turns.append(next_turn[turns[-1]])
        if len(turns) == num_turns:
            sessions.append([requests[i]["timestamp"] / 1000 for i in turns])
    if len(sessions) < num_sessions:
        raise ConfigError(f"trace {trace!r} has {len(sessions)} conversations of {num_turns}+ turns, "
                          f"{num_sessions} asked; ask for fewer sessions or turns")
    return sessions[:num_sessions]


def qa_times(num_users: int, num_rounds: int, qps: float) -> list[list[float]]:
    """LMCache's multi-round QA send times (s): user i at i / qps, then every num_users / qps."""
    return [[(user + num_users * turn) / qps for turn in range(num_rounds)] for user in range(num_users)]


def arrival_times(workload: Workload) -> list[list[float]]:
    """Each session's turn times (bench seconds): LMCache's QA timing with `qps`, else the scaled trace's."""
    if workload.qps is not None:
        return qa_times(workload.num_sessions, workload.num_turns, workload.qps)
    times = conversation_times(workload.trace, workload.num_sessions, workload.num_turns)
    return [[t * workload.time_scale for t in turn_times] for turn_times in times]


def make_sessions(workload: Workload, seed: int = 0) -> list[Session]:
    """The workload's sessions: seeded token ids, arrival times from arrival_times()."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]

    system = ids(workload.system_tokens)
    return [Session(context=system + ids(workload.context_tokens),
                    messages=[ids(workload.message_tokens) for _ in range(workload.num_turns)],
                    arrivals_s=turn_times) for turn_times in arrival_times(workload)]
