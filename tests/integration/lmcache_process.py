"""One LMCache engine in its own process (the way a second serving replica sees kvstore): store a prompt's KV
or look it up and retrieve it, and report as JSON. Run by tests/integration/test_lmcache_processes.py.

    python -m tests.integration.lmcache_process store|retrieve URL OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from connector.lmcache.plugin import require_remote
from kvstore.errors import KVStoreError
from tests.integration.test_lmcache import CHUNK, DIM, HEADS, LAYERS, kv, make_engine, tokens, wait_stored

SEED = 41


def main(mode: str, url: str, out: str) -> None:
    engine = make_engine(url, hash_algorithm="builtin")  # LMCache's default: Python's hash()
    report: dict[str, object] = {}
    try:
        require_remote(engine)
    except KVStoreError as exc:
        report["refused"] = str(exc)
    else:
        prompt = tokens(SEED)
        if mode == "store":
            engine.store(prompt, kv=kv(SEED))
            wait_stored(url, len(prompt) // CHUNK)
        else:
            report["lookup_tokens"] = engine.lookup(prompt)
            target = torch.zeros(2, LAYERS, len(prompt), HEADS * DIM)
            report["retrieved_tokens"] = int(engine.retrieve(prompt, kv=target).sum())
            report["identical"] = bool(torch.equal(target, kv(SEED)))
    engine.close()
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
