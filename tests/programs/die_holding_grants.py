"""Take a read lease on LEASED and a reservation for RESERVED, then die by SIGKILL without releasing either.

    python -m tests.programs.die_holding_grants URL LEASED RESERVED
"""

from __future__ import annotations

import os
import signal
import sys

import httpx


def main(url: str, leased: str, reserved: str) -> None:
    assert httpx.post(url + "/v1/shm/acquire", json={"keys": [leased]}).json()["leases"][0] is not None
    assert len(httpx.post(url + "/v1/shm/reserve", json={"keys": [reserved]}).json()["grants"]) == 1
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
