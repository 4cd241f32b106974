"""Open an NVMe tier on ROOT (taking its directory lock), say "locked", then hold it until killed.

    python -m tests.programs.dir_lock_holder ROOT
"""

from __future__ import annotations

import sys
import threading

from tiers.nvme import NVMeTier


def main(root: str) -> None:
    tier = NVMeTier(path=root, capacity_bytes=1 << 20)
    print("locked", flush=True)
    threading.Event().wait()  # until SIGKILL: the kernel must drop the lock with the process
    tier.close()


if __name__ == "__main__":
    main(sys.argv[1])
