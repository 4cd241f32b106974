"""A store process killed with SIGKILL in the middle of writes: after restart every acknowledged
chunk reads back byte-identical and no torn chunk is visible."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from tests.conftest import make_chunk, store_config
from tiers.dir_lock import LOCK_NAME

# 4 layers x 2 x 64 tokens x 4 heads x 64 dims x 2 B = 512 KiB per chunk: writes take long enough to be cut.
LAYOUT = KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, dtype="float16", chunk_tokens=64)

CHILD = textwrap.dedent("""
    import sys, torch
    from kvstore.store import TieredStore
    from tests.conftest import make_chunk, store_config
    from tests.kvstore.test_crash import LAYOUT
    from pathlib import Path
    store = TieredStore(store_config(LAYOUT, Path(sys.argv[1]), host_chunks=4, nvme_chunks=400))
    for batch in range(10_000):
        tokens = torch.arange(batch * 1000, batch * 1000 + 4 * LAYOUT.chunk_tokens, dtype=torch.int32)
        keys = store.chunk_keys(tokens)
        result = store.put_many(keys, [make_chunk(LAYOUT, batch * 10 + i) for i in range(len(keys))])
        store.flush()  # acknowledged = on the NVMe tier
        for i, key in enumerate(keys):
            if key in result.stored:
                print("ACK", key.hex(), batch * 10 + i, flush=True)
""")


def test_sigkill_mid_write_loses_no_acknowledged_chunk(tmp_path: Path) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             cwd=root, env={**os.environ, "PYTHONPATH": root})
    acked: dict[bytes, int] = {}
    assert child.stdout is not None
    for line in child.stdout:
        _, key_hex, seed = line.split()
        acked[bytes.fromhex(key_hex)] = int(seed)
        if len(acked) >= 40:
            break
    child.send_signal(signal.SIGKILL)  # the child is in the middle of the next batch's writes
    child.wait()
    assert child.returncode == -signal.SIGKILL

    with TieredStore(store_config(LAYOUT, tmp_path, host_chunks=4, nvme_chunks=400)) as store:
        recovered = [key for key, _ in store.levels[1].tier.keys()]
        assert set(acked) <= set(recovered)
        out = torch.empty(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
        for key in recovered:  # every visible chunk is whole (checksums pass)
            assert store.get(key, out), f"torn or corrupt chunk {key.hex()} is visible"
            if key in acked:
                assert torch.equal(out, make_chunk(LAYOUT, acked[key]))
        assert store.stats()["tiers"]["nvme"]["corrupt"] == 0
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".kvc") and p.name != LOCK_NAME]
    assert leftovers == [], "temp files of the killed writes were not cleaned at recovery"
