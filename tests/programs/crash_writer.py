"""A store that writes batches of 512 KiB chunks until killed, printing "ACK KEY SEED" for every chunk that reached
the NVMe tier (acknowledged).

    python -m tests.programs.crash_writer ROOT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from tests.conftest import make_chunk, store_config

# 4 layers x 2 x 64 tokens x 4 heads x 64 dims x 2 B = 512 KiB per chunk: writes take long enough to be cut.
LAYOUT = KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, dtype="float16", chunk_tokens=64)


def main(root: Path) -> None:
    store = TieredStore(store_config(LAYOUT, root, host_chunks=4, nvme_chunks=400))
    for batch in range(10_000):
        tokens = torch.arange(batch * 1000, batch * 1000 + 4 * LAYOUT.chunk_tokens, dtype=torch.int32)
        keys = store.chunk_keys(tokens)
        result = store.put_many(keys, [make_chunk(LAYOUT, batch * 10 + i) for i in range(len(keys))])
        store.flush()  # acknowledged = on the NVMe tier
        for i, key in enumerate(keys):
            if key in result.stored:
                print("ACK", key.hex(), batch * 10 + i, flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
