"""Token sampling: greedy at temperature 0, else temperature + top-p from a per-request seeded generator."""

from __future__ import annotations

import torch

from connector.engine.sequence import SamplingParams


class Sampler:
    """Keeps one torch.Generator per seeded request, so a request's draws do not depend on its batch."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, params: SamplingParams, request_id: str) -> int:
        """One token from `logits` [vocab] (float32, any device)."""
        logits = logits.float().cpu()  # CPU draws: the same tokens whatever device the model ran on
        if params.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            probs = top_p_filter(probs, params.top_p)
        return int(torch.multinomial(probs, 1, generator=self._generator(params, request_id)))

    def _generator(self, params: SamplingParams, request_id: str) -> torch.Generator | None:
        if params.seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = self._generators[request_id] = torch.Generator().manual_seed(params.seed)
        return gen

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalize."""
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum()
