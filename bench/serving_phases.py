"""A run of `kvstore bench serving` in two phases, for the rolling restart: every session's first turns, then
(after the restart) its later turns, each session going on from the history its first turns left."""

from __future__ import annotations

from dataclasses import replace

from bench.serving_client import RunResult
from bench.serving_workload import Session


def first_turns(sessions: list[Session], num_turns: int) -> list[Session]:
    """The sessions cut to their first `num_turns` turns."""
    return [replace(s, messages=s.messages[:num_turns], arrivals_s=s.arrivals_s[:num_turns]) for s in sessions]


def later_turns(sessions: list[Session], first: RunResult, num_turns: int) -> tuple[list[Session], int]:
    """The sessions' turns after the first `num_turns`, each prompt carrying the history (messages and answers) of
    `first`'s run of them, their times shifted so the earliest comes first; and how many turns are dropped
    (those of sessions whose first turns failed: they count as failed).

    Raises:
        ValueError: `first` ran other sessions (its by_session does not match).
    """
    if len(first.by_session) != len(sessions):
        raise ValueError(f"the first phase ran {len(first.by_session)} sessions, not these {len(sessions)}")
    rest = [(s, done) for s, done in zip(sessions, first.by_session, strict=True) if len(done) == num_turns]
    dropped = sum(len(s.messages) - num_turns for s, done in zip(sessions, first.by_session, strict=True)
                  if len(done) != num_turns)
    if not rest or num_turns >= len(sessions[0].messages):
        return [], dropped
    origin = min(s.arrivals_s[num_turns] for s, _ in rest)
    later = []
    for s, done in rest:
        history = list(s.context)
        for message, completion in zip(s.messages[:num_turns], done, strict=True):
            history += message + completion.token_ids
        later.append(Session(context=history, messages=s.messages[num_turns:],
                             arrivals_s=[t - origin for t in s.arrivals_s[num_turns:]]))
    return later, dropped


def joined(first: RunResult, later: RunResult | None, num_turns: int, dropped: int) -> RunResult:
    """Both phases as one run: the later phase's turns numbered after the first's, wall times added."""
    if later is None:
        return RunResult(first.completions, first.num_failed + dropped, first.wall_s, first.turns, first.by_session)
    return RunResult(first.completions + later.completions, first.num_failed + later.num_failed + dropped,
                     first.wall_s + later.wall_s, first.turns + [t + num_turns for t in later.turns])
