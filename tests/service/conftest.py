"""A real `kvstore serve` subprocess on a free port, with its config file on tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.layout import KVLayout
from service.process import Daemon, write_config
from tests.connector.conftest import CHUNK, MODEL

# The test engine's layout, so one daemon serves the engine test too:
# 2 layers x 2 planes x 16 tokens x 2 kv heads x 16 dims x 4 bytes (float32) = 8 KiB per chunk
LAYOUT = MODEL.kv_layout(CHUNK)
TOKENS = {"a": "token-aaaa-1234", "b": "token-bbbb-5678", "q": "token-qqqq-9999"}


def start_daemon(root: Path, *, layout: KVLayout = LAYOUT, uds: Path | None = None, **config: Any) -> Daemon:
    return Daemon(write_config(root, layout=layout, **config), root / "daemon.log", uds=uds).start()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A shared daemon without auth (the anonymous tenant may use shared-memory segments)."""
    root = tmp_path_factory.mktemp("daemon")
    d = start_daemon(root, host_chunks=64, service={"lease_s": 3.0})
    yield d
    d.close()


@pytest.fixture(scope="session")
def tenant_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A shared daemon with three tenants: a (shm), b (HTTP only), q (quota of 4 chunks)."""
    root = tmp_path_factory.mktemp("tenants")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
               {"name": "b", "token": TOKENS["b"], "salt": "salt-b", "shm": False},
               {"name": "q", "token": TOKENS["q"], "salt": "salt-q",
                "quota": {"host": 4 * LAYOUT.chunk_bytes, "nvme": 64 * LAYOUT.chunk_bytes}}]
    # Short leases and room for 64 chunks: the schemathesis run shares this daemon and may leave
    # shared-memory grants behind, which must expire before the next test's puts need the room.
    d = start_daemon(root, host_chunks=64, tenants=tenants,
                     service={"max_body_bytes": 1 << 20, "max_batch_chunks": 64, "lease_s": 1.0})
    yield d
    d.close()
