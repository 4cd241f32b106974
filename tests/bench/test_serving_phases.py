"""The rolling restart's two phases: first turns, then later turns that go on from the first turns' history."""

from __future__ import annotations

import pytest

from bench.serving_client import RunResult
from bench.serving_phases import first_turns, joined, later_turns
from bench.serving_workload import Session
from bench.vllm_server import Completion


def _answer(ids: list[int], ttft_s: float = 1.0) -> Completion:
    return Completion(token_ids=ids, num_prompt_tokens=0, num_cached_tokens=0, ttft_s=ttft_s, latency_s=ttft_s + 1)


SESSIONS = [Session(context=[1, 2], messages=[[10], [11], [12]], arrivals_s=[0.0, 5.0, 9.0]),
            Session(context=[3, 4], messages=[[20], [21], [22]], arrivals_s=[1.0, 4.0, 8.0])]


def test_later_turns_carry_the_first_turns_messages_and_answers() -> None:
    first = first_turns(SESSIONS, 1)
    assert [s.messages for s in first] == [[[10]], [[20]]] and [s.arrivals_s for s in first] == [[0.0], [1.0]]
    ran = RunResult([_answer([7, 7]), _answer([8])], 0, 2.0, [0, 0], [[_answer([7, 7])], [_answer([8])]])
    later, dropped = later_turns(SESSIONS, ran, 1)
    assert dropped == 0
    assert [s.context for s in later] == [[1, 2, 10, 7, 7], [3, 4, 20, 8]], "what run_session would have sent"
    assert [s.messages for s in later] == [[[11], [12]], [[21], [22]]]
    assert [s.arrivals_s for s in later] == [[1.0, 5.0], [0.0, 4.0]], "shifted so the earliest later turn is at 0"


def test_a_session_whose_first_turn_failed_drops_its_later_turns_as_failed() -> None:
    ran = RunResult([_answer([7])], 1, 2.0, [0], [[_answer([7])], []])
    later, dropped = later_turns(SESSIONS, ran, 1)
    assert len(later) == 1 and dropped == 2
    second = RunResult([_answer([9], 3.0), _answer([9], 5.0)], 0, 4.0, [0, 1], [])
    whole = joined(ran, second, 1, dropped)
    assert whole.num_failed == 3 and whole.turns == [0, 1, 2] and whole.wall_s == 6.0
    assert whole.summary()["ttft_later_turns"] == 4.0


def test_the_later_phase_must_follow_the_same_sessions() -> None:
    with pytest.raises(ValueError, match="ran 1 sessions, not these 2"):
        later_turns(SESSIONS, RunResult([], 0, 1.0, [], [[]]), 1)
