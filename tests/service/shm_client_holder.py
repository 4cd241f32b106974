"""A child program of tests/service/test_tenant_memory.py: a shared-memory client that then hangs.

    python -m tests.service.shm_client_holder URL TOKEN

Opens a KVStoreClient on shared memory (its staging segment) and takes a chunk from its pool (a
second segment), prints "ready" and sleeps until killed, as a client process that dies with its
segments open.
"""

from __future__ import annotations

import sys
import time

from connector.client import KVStoreClient


def main() -> None:
    client = KVStoreClient(sys.argv[1], token=sys.argv[2], use_shm=True)
    assert client._segments is not None and client._segments.wait_pool(30.0)  # empty_chunk() never waits for it
    chunk = client.empty_chunk()
    print("ready", chunk.shape, flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
