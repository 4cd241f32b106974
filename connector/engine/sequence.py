"""`Sequence`: one request's tokens, pages, progress and timestamps as the engine tracks them; `SamplingParams`."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from kvstore.errors import ConfigError
from kvstore.hashing import ChunkHasher

_ids = itertools.count()
PAGE_HASH_ROOT = b"kvstore-engine-page-hash-root/1\0"[:16]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How to pick tokens: temperature 0 is greedy; otherwise seeded temperature + top-p (nucleus)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request inside the engine.

    Invariant: `num_computed_tokens` tokens have KV in `block_ids`; the next step feeds tokens
    [num_computed_tokens, num_tokens). A decoding sequence has exactly one token left to feed.
    """

    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    request_id: str = ""
    page_size: int = 16
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_cached_pages: int = 0  # leading pages registered in the block pool's prefix cache
    num_saved_chunks: int = 0  # leading chunks known to be in the store
    num_pool_hit_tokens: int = 0
    num_store_hit_tokens: int = 0
    # the scheduler's last store lookup: ((max tokens, the connector's saved chunks then), hit tokens)
    store_lookup: tuple[tuple[int, int], int] | None = None
    num_preemptions: int = 0
    admit_time: float | None = None  # first admission into the running batch
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ConfigError("a prompt needs at least one token")
        self.prompt_token_ids = [int(t) for t in self.prompt_token_ids]
        if not self.request_id:
            self.request_id = f"req-{next(_ids)}"
        self._hasher = ChunkHasher(PAGE_HASH_ROOT, self.page_size)
        self._hasher.extend(self.prompt_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens still to feed before the next token can be sampled."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        return bool(self.output_token_ids) and self.num_remaining_tokens == 1

    @property
    def page_hashes(self) -> list[bytes]:
        """Chained hashes of every full page of `token_ids` (prefix order)."""
        return self._hasher.keys

    def append_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(int(token_id))
        self._hasher.extend([int(token_id)])
        if self.first_token_time is None:
            self.first_token_time = now
        self.token_times.append(now)

    @property
    def is_finished_by_params(self) -> bool:
        eos = self.sampling.eos_token_id
        return len(self.output_token_ids) >= self.sampling.max_tokens or (
            eos is not None and bool(self.output_token_ids) and self.output_token_ids[-1] == eos
        )
