"""Two threads put 1-3 MiB chunks into an NVMe tier until the process is killed, printing each acknowledged index.

    python -m tests.programs.nvme_writer ROOT
"""

from __future__ import annotations

import sys
import threading

import torch

from tests.tiers.conftest import key_of, meta_of
from tiers.nvme import NVMeTier

MiB = 1 << 20
_BASE = torch.randint(0, 256, (8 * MiB,), dtype=torch.uint8, generator=torch.Generator().manual_seed(99))


def killed_payload(i: int) -> torch.Tensor:
    """Cheap distinct payloads of 1-3 MiB (a slice of one random block), so the kill lands mid-write."""
    start = (i * 40_961) % MiB
    return _BASE[start : start + MiB + (i * 7919) % (2 * MiB)].clone()


def main(root: str) -> None:
    tier = NVMeTier(path=root, capacity_bytes=1 << 40, num_workers=2)
    lock = threading.Lock()

    def writer(start: int) -> None:
        i = start
        while True:
            payload = killed_payload(i)
            tier.put(key_of(i), payload, meta_of(payload))
            with lock:
                print(i, flush=True)  # acknowledged: put returned
            i += 2

    for start in (0, 1):
        threading.Thread(target=writer, args=(start,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1])
