"""Tenant b, in its own process, tries every way at tenant a's segment (its id and socket given); prints the status of
a get and of a put through that segment and whether the segment's descriptor was "received" or "refused".

    python -m tests.programs.segment_attack URL TOKEN SEGMENT SOCKET KEY
"""

from __future__ import annotations

import sys

import httpx

from connector.client_segment import receive_fd
from kvstore.errors import KVStoreError


def main(url: str, token: str, segment: str, sock: str, key: str) -> str:
    auth = {"Authorization": "Bearer " + token}
    body = {"segment": segment, "keys": [key], "slots": [0]}
    got = httpx.post(url + "/v1/shm/segments/get", json=body, headers=auth)
    put = httpx.post(url + "/v1/shm/segments/put", json=body, headers=auth)
    try:
        receive_fd(sock, segment, token)
        fd = "received"
    except KVStoreError:
        fd = "refused"
    return f"{got.status_code} {put.status_code} {fd}"


if __name__ == "__main__":
    print(main(*sys.argv[1:6]))
