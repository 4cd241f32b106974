"""Replay a suite workload through each named eviction policy; print JSON: which implementation ran (python or
mypyc) and, per policy and capacity, the hits, a digest of every victim list in order, and the policy's module.

    python -m tests.programs.policy_decisions WORKLOAD POLICY[,POLICY...]
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from kvstore.sim import replay as rp
from kvstore.sim.suite import load_replay_trace
from policies.eviction import _native


class Recorder:
    """An eviction policy passed through, each victim list it returns hashed in order."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.log = inner, inner.name, hashlib.sha256()

    def on_insert(self, key: Any, info: Any) -> None:
        self.inner.on_insert(key, info)

    def on_access(self, key: Any, info: Any) -> None:
        self.inner.on_access(key, info)

    def on_remove(self, key: Any) -> None:
        self.inner.on_remove(key)

    def __len__(self) -> int:
        return len(self.inner)

    def victims(self, n: int, pinned: Any = ()) -> Any:
        out = self.inner.victims(n, pinned)
        self.log.update(repr(out).encode())
        return out


def main(workload: str, policies: str) -> dict[str, Any]:
    trace = load_replay_trace(workload)
    result: dict[str, Any] = {"implementation": _native.IMPLEMENTATION}
    for policy in policies.split(","):
        for pct in (1.0, 5.0):
            capacity = rp.capacity_blocks_for(trace, pct)
            evict, admit = rp.build_policies(policy, capacity, trace)
            recorder = Recorder(evict)
            hits = rp._run(trace, recorder, admit, capacity, progress=False)[0]
            result[f"{policy}@{pct}"] = [hits, recorder.log.hexdigest(), type(evict).__module__]
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
