"""Prefill-to-decode handoff (pure Python, no vllm import): what a prefill answer tells the decode instance.

A prefill instance (kv_role "kv_producer") saves a prompt's whole chunks in the step that computes them;
they are gathered before the step ends and reach the store shortly after, on the save queue. So when
its answer comes back, the chunks are committed or in flight. The answer's `kv_transfer_params` carry a
`Handoff`: how many leading chunks of the prompt were saved and the key of the last one. A proxy passes
the dict unchanged in the decode request's `kv_transfer_params`.

The decode instance computes the prompt's chunk keys itself (same model, scope and tokens give the
same keys; the last key is compared, so a handoff from another model or another tokenisation is
ignored). It counts the announced chunks as hits at once, and its loader waits for the ones that are
not in the store yet, at most `handoff_wait_s` (polling the store's lookup, and not at all once the
store stops answering: its breaker open), then reads. A chunk that has not arrived by then is recomputed: the wait bounds the cost of a lost or slow save, never a failed
request. The cost of the guarantee is that wait, paid only by requests whose chunks are still in
flight, on the loader thread (other requests keep decoding).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvstore.errors import ConfigError

PARAM = "kvstore_handoff"
_FIRST_POLL_S, _MAX_POLL_S = 0.002, 0.05


@dataclass(frozen=True, slots=True)
class Handoff:
    """The first `chunks` chunks of a prompt were saved by a prefill instance; `last_key` names the last.
    With `tail_key`, the prompt's last `tail_tokens` tokens (after its whole chunks) were saved too."""

    chunks: int
    last_key: bytes
    tail_tokens: int = 0
    tail_key: bytes = b""

    def to_params(self) -> dict[str, object]:
        raw: dict[str, object] = {"chunks": self.chunks, "last_key": self.last_key.hex()}
        if self.tail_key:
            raw.update(tail_tokens=self.tail_tokens, tail_key=self.tail_key.hex())
        return {PARAM: raw}

    @classmethod
    def from_params(cls, params: Mapping[str, object] | None) -> Handoff | None:
        """The handoff in a request's kv_transfer_params; None if absent or malformed (then nothing waits)."""
        raw = params.get(PARAM) if isinstance(params, Mapping) else None
        if not isinstance(raw, Mapping):
            return None
        chunks, last_key = _count(raw.get("chunks", 0)), _key(raw.get("last_key", ""))
        tail_tokens, tail_key = _count(raw.get("tail_tokens", 0)), _key(raw.get("tail_key", ""))
        if chunks is None or last_key is None or tail_tokens is None or tail_key is None:
            return None
        if (chunks == 0 and not tail_key) or bool(chunks) != bool(last_key) or bool(tail_tokens) != bool(tail_key):
            return None
        return cls(chunks, last_key, tail_tokens, tail_key)

    def matches(self, keys: Sequence[bytes]) -> bool:
        """True when this handoff is about the prompt whose chain is `keys` (same model, scope and tokens)."""
        return len(keys) >= self.chunks and (self.chunks == 0 or keys[self.chunks - 1] == self.last_key)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _key(value: object) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def wait_until_held(lookup: Callable[[Sequence[bytes]], int], keys: Sequence[bytes], timeout_s: float, *,
                    store_down: Callable[[], bool]) -> float:
    """Poll `lookup` until it holds all of `keys`, `timeout_s` passed or `store_down()` (a store that does not
    answer now: every poll would be a miss); returns the seconds waited."""
    start = time.monotonic()
    poll = _FIRST_POLL_S
    while lookup(keys) < len(keys):
        waited = time.monotonic() - start
        if waited >= timeout_s or store_down():
            return waited
        time.sleep(min(poll, timeout_s - waited))
        poll = min(poll * 2, _MAX_POLL_S)
    return time.monotonic() - start


def handoff_wait_option(extra: Mapping[str, object], default: float = 5.0) -> float:
    """kv_connector_extra_config "handoff_wait_s": seconds from 0 to 600 (0: never wait for announced chunks)."""
    value = extra.get("handoff_wait_s", default)
    try:
        seconds = float(value)  # type: ignore[arg-type]  # checked below, whatever it was
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 <= seconds <= 600:
        raise ConfigError(f"kv_connector_extra_config handoff_wait_s={value!r}: give seconds from 0 to 600 "
                          f"(default {default})")
    return seconds
