"""Load a Mooncake-format JSONL request trace (timestamp, input_length, hash_ids) for replay."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from kvstore.errors import ConfigError

logger = logging.getLogger(__name__)

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: its arrival time, prompt length and chained block ids (head first)."""

    timestamp: float
    input_tokens: int
    block_ids: tuple[int, ...]

    def block_tokens(self, index: int, block_size: int = MOONCAKE_BLOCK_TOKENS) -> int:
        """Prompt tokens block `index` covers (the last block may be partial)."""
        return max(0, min(block_size, self.input_tokens - index * block_size))


@dataclass(frozen=True, slots=True)
class Trace:
    """A request trace in timestamp order."""

    name: str
    requests: list[TraceRequest]
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    @property
    def num_accesses(self) -> int:
        return sum(len(r.block_ids) for r in self.requests)

    @property
    def num_distinct_blocks(self) -> int:
        return len({b for r in self.requests for b in r.block_ids})

    def head(self, num_requests: int) -> Trace:
        """The first `num_requests` requests, for quick tests."""
        return Trace(self.name, self.requests[:num_requests], self.block_tokens)


def load_mooncake(path: Path | str, *, limit: int | None = None, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """Read a Mooncake JSONL trace; requests are sorted by timestamp (stable).

    Raises:
        ConfigError: the file is missing or a line lacks `hash_ids`/`input_length` (line number given).
    """
    path = Path(path)
    requests: list[TraceRequest] = []
    try:
        with path.open() as fh:
            for line_no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                if limit is not None and len(requests) >= limit:
                    break
                requests.append(_parse_line(line, line_no, path))
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}; pass an existing Mooncake JSONL file") from exc
    requests.sort(key=lambda r: r.timestamp)
    logger.info("loaded %d requests from %s", len(requests), path)
    return Trace(path.name, requests, block_tokens)


def _parse_line(line: str, line_no: int, path: Path) -> TraceRequest:
    try:
        row = json.loads(line)
        return TraceRequest(float(row.get("timestamp", 0)), int(row["input_length"]), tuple(int(h) for h in row["hash_ids"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path}:{line_no}: not a Mooncake trace row ({exc!r}); expected timestamp, input_length, hash_ids"
        ) from exc
