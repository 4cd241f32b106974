"""Sampler: greedy is argmax; seeded sampling is reproducible per request; top-p keeps the nucleus only."""

from __future__ import annotations

import torch

from connector.engine.sampler import Sampler, top_p_filter
from connector.engine.sequence import SamplingParams


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, -1.0, 2.9])
    assert Sampler().sample(logits, SamplingParams(), "r") == 1


def test_seeded_draws_repeat_per_request_and_differ_across_seeds() -> None:
    logits = torch.zeros(50)
    params = SamplingParams(temperature=1.0, seed=3)

    def draws(sampler: Sampler, request_id: str, p: SamplingParams = params) -> list[int]:
        return [sampler.sample(logits, p, request_id) for _ in range(20)]

    shared = Sampler()
    first = draws(shared, "a")
    assert draws(shared, "b") == first  # another request with the same seed, interleaved or not
    assert draws(Sampler(), "a", SamplingParams(temperature=1.0, seed=4)) != first


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    kept = top_p_filter(probs.clone(), 0.75)
    torch.testing.assert_close(kept, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    sampler = Sampler()
    params = SamplingParams(temperature=1.0, top_p=0.75, seed=0)
    assert {sampler.sample(probs.log(), params, "r") for _ in range(200)} == {0, 1}
