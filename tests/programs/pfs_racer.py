"""Put chunk 0 (payload SEED of NBYTES) 20 times into a shared PFS directory, racing the test; "ready" first.

    python -m tests.programs.pfs_racer ROOT SEED NBYTES
"""

from __future__ import annotations

import sys

from tests.tiers.conftest import key_of, meta_of, payload_of
from tiers.pfs import PFSTier


def main(root: str, seed: int, nbytes: int) -> None:
    tier = PFSTier(path=root, capacity_bytes=1 << 30)
    payload = payload_of(seed, nbytes)
    print("ready", flush=True)
    for _ in range(20):
        tier.put(key_of(0), payload, meta_of(payload))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
