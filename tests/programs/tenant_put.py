"""A tenant's client in its own process: put N chunks of prompt SEED (over shared memory or HTTP), print the stored count.

    python -m tests.programs.tenant_put URL TOKEN SEED N SHM(0|1)
"""

from __future__ import annotations

import sys

from connector.client import KVStoreClient
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT


def prompt(seed: int, num_chunks: int) -> list[int]:
    """The token ids of prompt `seed`: disjoint from every other seed's."""
    return list(range(seed * 100_000, seed * 100_000 + num_chunks * LAYOUT.chunk_tokens))


def main(url: str, token: str, seed: int, num_chunks: int, use_shm: bool) -> int:
    with KVStoreClient(url, token=token, use_shm=use_shm) as client:
        keys = client.chunk_keys(prompt(seed, num_chunks))
        return len(client.put_many(keys, [make_chunk(LAYOUT, seed + i) for i in range(num_chunks)]).stored)


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"))
