"""Keep N chunks pinned by re-acquiring their read leases (a new lease before releasing the old) until STOP_FILE
exists or SECONDS pass; print each answer in order: its status, or "pin" for a refusal naming the renewal bound.

    python -m tests.programs.lease_renewer URL TOKEN SECONDS NUM_CHUNKS CHUNK_TOKENS STOP_FILE
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx


def main(url: str, token: str, seconds: float, num_tokens: int, stop_file: Path) -> list[str]:
    auth = {"Authorization": "Bearer " + token}
    keys = httpx.post(url + "/v1/lookup", json={"token_ids": list(range(num_tokens))}, headers=auth).json()["keys"]
    end = time.monotonic() + seconds
    codes: list[str] = []
    held: list[str] = []
    while time.monotonic() < end and not stop_file.exists():
        got = httpx.post(url + "/v1/shm/acquire", json={"keys": keys}, headers=auth)
        codes.append("pin" if "max_pin_s" in got.text else str(got.status_code))
        if held:
            httpx.post(url + "/v1/shm/release", json={"ids": held}, headers=auth)
        held = [lease["id"] for lease in got.json()["leases"] if lease] if got.status_code == 200 else []
        time.sleep(0.05)
    return codes


if __name__ == "__main__":
    num_chunks, chunk_tokens = int(sys.argv[4]), int(sys.argv[5])
    print(" ".join(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), num_chunks * chunk_tokens, Path(sys.argv[6]))))
