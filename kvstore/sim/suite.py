"""The workload suite for eviction policies: real traces (when present) and the seeded generators.

Members (`workload_suite`):

======================  =========================================================================
conversation            Mooncake conversation trace (JSONL with hash_ids), from --traces DIR
azure-conv              Azure 2023 conversation CSV, block ids from the planner's reuse model, from --traces DIR
azure-code              Azure 2023 code CSV (shipped in kvstore/sim/data), the same reuse model
gen:chat ... gen:onehit `kvstore.sim.generators` families, seed 0; need no file
======================  =========================================================================

Without the full trace files (a fresh clone has none: pass --traces DIR, or set KVSTORE_TRACES), the
two trace members run on the samples the package ships (kvstore/bundled.py), named
`conversation-sample` and `azure-conv-sample` so that no figure is mistaken for the full trace's, and
the member's `note` says so; nothing is skipped.

The reuse model for CSVs without prefix ids (`kvstore.sim.trace_files.AZURE_REUSE_MODEL`, the planner's too)
is used with the planner CLI's defaults: 200 conversations, half of each prompt repeated.
`load_replay_trace` reads any of: a member name, `gen:FAMILY[:SEED]`, a `.csv` (Azure) or a
Mooncake `.jsonl` path, so `kvstore replay` takes them all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvstore.bundled import BUNDLED_TRACES, resolve_trace
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
SAMPLES = {"conversation": ("mooncake-sample", "first 2,000 of 12,031 requests"),
           "azure-conv": ("azure-sample", "first 500 requests")}


@dataclass(frozen=True, slots=True)
class SuiteMember:
    """One workload: its name, family and loader; `skip` says why it cannot run here (empty: it can),
    `note` what a user should know about it (a bundled sample standing in for a full trace)."""

    name: str
    family: str
    description: str
    load: Callable[[], Trace]
    skip: str = ""
    note: str = ""


def _trace_path(name: str, trace_dir: Path | None) -> Path | None:
    for folder in (trace_dir, DATA_DIR):
        if folder is not None and (folder / TRACE_FILES[name]).exists():
            return folder / TRACE_FILES[name]
    return None


def workload_suite(trace_dir: Path | str | None = None, *, seed: int = 0) -> list[SuiteMember]:
    """Every member; trace members look in `trace_dir` ($KVSTORE_TRACES when None), then in the
    package's data folder, then fall back to the bundled samples."""
    folder = trace_dir if trace_dir is not None else os.environ.get("KVSTORE_TRACES") or None
    members = [_trace_member(name, Path(folder) if folder else None) for name in TRACE_FILES]
    for family in GENERATORS:
        doc = (GENERATORS[family].__doc__ or "").strip().splitlines()[0]
        members.append(SuiteMember(f"gen:{family}", family, doc, _generator_loader(family, seed)))
    return members


_DESCRIPTIONS = {
    "conversation": "Mooncake (Kimi) conversation trace, 12,031 requests",
    "azure-conv": "Azure 2023 conversation arrivals and lengths, planner reuse model",
    "azure-code": "Azure 2023 code arrivals and lengths, planner reuse model",
}


def _trace_member(name: str, folder: Path | None) -> SuiteMember:
    """A trace member from its full file, else from its bundled sample, else a member that says why it skips."""
    path = _trace_path(name, folder)
    if path is not None:
        return SuiteMember(name, name, _DESCRIPTIONS[name], _file_loader(path, name))
    where = f"in {folder}" if folder is not None else "(no --traces DIR given)"
    if name in SAMPLES and BUNDLED_TRACES[SAMPLES[name][0]].exists():
        sample, extent = SAMPLES[name]
        note = (f"{TRACE_FILES[name]} not found {where}: running the bundled {sample} ({extent}) as "
                f"{name}-sample; pass --traces DIR holding {TRACE_FILES[name]} for the full trace")
        return SuiteMember(f"{name}-sample", name, f"{_DESCRIPTIONS[name]} (bundled sample, {extent})",
                           _file_loader(BUNDLED_TRACES[sample], name), note=note)
    skip = f"{TRACE_FILES[name]} not found {where}; pass --traces DIR holding it"
    return SuiteMember(name, name, _DESCRIPTIONS[name], _file_loader(path, name), skip)


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
