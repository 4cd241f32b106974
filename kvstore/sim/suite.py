"""The workload suite for eviction policies: real traces (when present) and the seeded generators.

Members (`workload_suite`):

======================  =========================================================================
conversation            Mooncake conversation trace (JSONL with hash_ids); needs the file
azure-conv              Azure 2023 conversation CSV, block ids from the planner's reuse model; needs the file
azure-code              Azure 2023 code CSV (shipped in kvstore/sim/data), the same reuse model
gen:chat ... gen:onehit `kvstore.sim.generators` families, seed 0; need no file
======================  =========================================================================

The reuse model for CSVs without prefix ids (`kvstore.sim.trace_files.AZURE_REUSE_MODEL`, the planner's too)
is used with the planner CLI's defaults: 200 conversations, half of each prompt repeated.
`load_replay_trace` reads any of: a member name, `gen:FAMILY[:SEED]`, a `.csv` (Azure) or a
Mooncake `.jsonl` path, so `kvstore replay` takes them all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvstore.bundled import resolve_trace
from kvstore.errors import ConfigError
from kvstore.sim.generators import BLOCK_TOKENS, GENERATORS, generate, rows_to_trace
from kvstore.sim.trace import Trace, load_mooncake
from kvstore.sim.trace_files import load_azure_csv

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent / "data"
AZURE_SESSIONS = 200  # the planner CLI's defaults for the Azure CSV reuse model
AZURE_REPEAT_SHARE = 0.5
TRACE_FILES = {"conversation": "mooncake_conversation.jsonl", "azure-conv": "azure_conv_2023.csv",
               "azure-code": "azure_code_2023.csv"}


@dataclass(frozen=True, slots=True)
class SuiteMember:
    """One workload: its name, family and loader; `skip` says why it cannot run here (empty: it can)."""

    name: str
    family: str
    description: str
    load: Callable[[], Trace]
    skip: str = ""


def _trace_path(name: str, trace_dir: Path | None) -> Path | None:
    for folder in (trace_dir, DATA_DIR):
        if folder is not None and (folder / TRACE_FILES[name]).exists():
            return folder / TRACE_FILES[name]
    return None


def workload_suite(trace_dir: Path | str | None = None, *, seed: int = 0) -> list[SuiteMember]:
    """Every member; trace members look in `trace_dir`, then in the package's data folder."""
    folder = Path(trace_dir) if trace_dir is not None else None
    members = []
    descriptions = {
        "conversation": "Mooncake (Kimi) conversation trace, 12,031 requests",
        "azure-conv": "Azure 2023 conversation arrivals and lengths, planner reuse model",
        "azure-code": "Azure 2023 code arrivals and lengths, planner reuse model",
    }
    for name, description in descriptions.items():
        path = _trace_path(name, folder)
        skip = "" if path is not None else f"{TRACE_FILES[name]} not found; pass --traces DIR holding it"
        members.append(SuiteMember(name, name, description, _file_loader(path, name), skip))
    for family in GENERATORS:
        doc = (GENERATORS[family].__doc__ or "").strip().splitlines()[0]
        members.append(SuiteMember(f"gen:{family}", family, doc, _generator_loader(family, seed)))
    return members


def _file_loader(path: Path | None, name: str) -> Callable[[], Trace]:
    def load() -> Trace:
        if path is None:
            raise ConfigError(f"suite member {name}: {TRACE_FILES[name]} not found; pass --traces DIR holding it")
        return load_trace_file(path)

    return load


def _generator_loader(family: str, seed: int) -> Callable[[], Trace]:
    return lambda: rows_to_trace(f"gen:{family}", generate(family, seed))


def load_trace_file(path: Path, *, limit: int | None = None, sessions: int = AZURE_SESSIONS,
                    repeat_share: float = AZURE_REPEAT_SHARE) -> Trace:
    """A Mooncake JSONL, or an Azure CSV with the planner's reuse model (512-token blocks)."""
    if path.suffix.lower() == ".csv":
        trace = load_azure_csv(path, block_tokens=BLOCK_TOKENS, sessions=sessions, repeat_share=repeat_share)
        return trace.head(limit) if limit is not None else trace
    return load_mooncake(path, limit=limit)


def load_replay_trace(spec: str | Path, *, limit: int | None = None, trace_dir: Path | None = None,
                      sessions: int = AZURE_SESSIONS, repeat_share: float = AZURE_REPEAT_SHARE) -> Trace:
    """What `kvstore replay TRACE` reads: a suite member name, `gen:FAMILY[:SEED]`, a bundled trace's
    name (kvstore/bundled.py) or a file; an Azure CSV gets block ids from the planner's reuse model
    with `sessions` and `repeat_share`."""
    text = str(spec)
    if text.startswith("gen:"):
        _, family, *rest = text.split(":")
        seed = _seed(rest, text)
        trace = rows_to_trace(f"gen:{family}" + (f":{seed}" if rest else ""), generate(family, seed))
        return trace.head(limit) if limit is not None else trace
    if text in TRACE_FILES:
        path = _trace_path(text, trace_dir)
        if path is None:
            raise ConfigError(f"{TRACE_FILES[text]} not found; pass --traces DIR holding it")
        return load_trace_file(path, limit=limit, sessions=sessions, repeat_share=repeat_share)
    return load_trace_file(resolve_trace(text), limit=limit, sessions=sessions, repeat_share=repeat_share)


def _seed(rest: list[str], text: str) -> int:
    if not rest:
        return 0
    try:
        return int(rest[0])
    except ValueError:
        raise ConfigError(f"bad generator spec {text!r}; use gen:FAMILY or gen:FAMILY:SEED") from None
