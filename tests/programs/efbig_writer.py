"""Under RLIMIT_FSIZE 1 MiB, put a small and a 2 MiB chunk into each file tier under ROOT; print a JSON report per
tier: the error message, its errno and the tier's used bytes (or no error).

    python -m tests.programs.efbig_writer ROOT
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from typing import Any

from kvstore.errors import TierIOError
from tests.tiers.conftest import FILE_KINDS, key_of, meta_of, payload_of
from tiers.registry import make_tier


def main(root: str) -> dict[str, dict[str, Any]]:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us instead of returning EFBIG
    small, big = payload_of(1, 100_000), payload_of(2, 2 << 20)
    tiers = {kind.value: make_tier(kind, path=os.path.join(root, kind.value), capacity_bytes=1 << 30)
             for kind in FILE_KINDS}
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    reports: dict[str, dict[str, Any]] = {}
    for name, tier in tiers.items():
        tier.put(key_of(1), small, meta_of(small))
        try:
            tier.put(key_of(2), big, meta_of(big))
            reports[name] = {"error": None}
        except TierIOError as exc:
            reports[name] = {"error": str(exc), "errno": exc.errno, "used": tier.used_bytes}
    return reports


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
