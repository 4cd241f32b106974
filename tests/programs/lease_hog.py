"""Take read leases on the chunks of a stored prompt (token ids FIRST..FIRST+NUM_TOKENS) one chunk at a time, over
and over, as fast as it can, for SECONDS, never releasing any; print "refused" once the daemon first says no (429).

    python -m tests.programs.lease_hog URL TOKEN SECONDS FIRST NUM_TOKENS
"""

from __future__ import annotations

import sys
import time

import httpx


def main(url: str, token: str, seconds: float, first: int, num_tokens: int) -> None:
    auth = {"Authorization": "Bearer " + token}
    with httpx.Client(base_url=url, headers=auth) as http:
        keys = http.post("/v1/lookup", json={"token_ids": list(range(first, first + num_tokens))}).json()["keys"]
        end, refused = time.monotonic() + seconds, False
        while time.monotonic() < end:
            for key in keys:
                if http.post("/v1/shm/acquire", json={"keys": [key]}).status_code == 429 and not refused:
                    print("refused", flush=True)
                    refused = True


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
