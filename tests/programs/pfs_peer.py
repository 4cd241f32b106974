"""Another process on a shared PFS directory, driven line by line on stdin: "put SEED NBYTES" answers "stored",
"remove SEED" answers what remove returned.

    python -m tests.programs.pfs_peer ROOT
"""

from __future__ import annotations

import sys

from tests.tiers.conftest import key_of, meta_of, payload_of
from tiers.pfs import PFSTier


def main(root: str) -> None:
    tier = PFSTier(path=root, capacity_bytes=1 << 30)
    for line in sys.stdin:
        command, seed, *rest = line.split()
        if command == "put":
            payload = payload_of(int(seed), int(rest[0]))
            tier.put(key_of(int(seed)), payload, meta_of(payload))
            print("stored", flush=True)
        else:
            print(tier.remove(key_of(int(seed))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
