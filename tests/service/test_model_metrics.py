"""Per-model, per-tier hit rates in a real daemon's /metrics: the real client names its model in a header,
lookups and gets count under it and under the tier that served each chunk; a tenant sees its own models
only; the number of model labels is capped; clients that name no model still work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from connector.client import KVStoreClient
from kvstore.errors import ConfigError
from kvstore.wire_types import MODEL_HEADER, UNNAMED_MODEL
from service.exposition import parse_samples, sample
from service.model_metrics import MAX_MODEL_LABELS, OTHER_MODEL
from service.process import Daemon
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, TOKENS, start_daemon

ADMIN = "admin-token-0123456789"
SCRAPER = "metrics-token-0123456789"
CHUNK = LAYOUT.chunk_tokens


@pytest.fixture(scope="module")
def tenants_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("model-metrics")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
               {"name": "b", "token": TOKENS["b"], "salt": "salt-b", "shm": False}]
    d = start_daemon(root, host_chunks=64, tenants=tenants, service={"admin_token": ADMIN, "metrics_token": SCRAPER})
    yield d
    d.close()


def scrape(url: str, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    reply = httpx.get(f"{url}/metrics", headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.text


def value(text: str, name: str, **labels: str) -> float:
    """The sample of `name` whose labels are exactly `labels` (0 when there is none)."""
    return sample(text, name, **labels)


def test_lookups_and_gets_count_per_model_and_tier_per_tenant(tenants_daemon: Daemon) -> None:
    url = tenants_daemon.url
    with KVStoreClient(url, token=TOKENS["a"], model="llama-a") as a, \
            KVStoreClient(url, token=TOKENS["b"], model="qwen-b") as b:
        keys = a.chunk_keys(list(range(3 * CHUNK)))
        assert a.put_many(keys[:2], [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)]).ok
        assert a.lookup_keys(keys) == 2  # 3 asked, 2 held
        outs = [a.empty_chunk() for _ in keys]
        assert a.get_many(keys, outs) == [True, True, False]  # over shared memory
        assert b.lookup_keys(b.chunk_keys(list(range(2 * CHUNK)))) == 0  # b's own namespace: misses
        assert b.get_many(keys[:1], [b.empty_chunk()]) == [False]  # over HTTP
    admin = scrape(url, ADMIN)
    a_labels = {"tenant": "a", "model": "llama-a"}
    assert value(admin, "kvstore_model_lookups_total", **a_labels) == 1
    assert value(admin, "kvstore_model_lookup_chunks_total", **a_labels) == 3
    assert value(admin, "kvstore_model_lookup_hit_chunks_total", **a_labels) == 2
    assert value(admin, "kvstore_model_lookup_hit_tokens_total", **a_labels) == 2 * CHUNK
    assert value(admin, "kvstore_model_lookup_hit_ratio", **a_labels) == pytest.approx(2 / 3, abs=1e-5)
    assert value(admin, "kvstore_model_get_chunks_total", **a_labels) == 3
    assert value(admin, "kvstore_model_get_hit_chunks_total", **a_labels, tier="host") == 2
    assert value(admin, "kvstore_model_get_hit_bytes_total", **a_labels, tier="host") == 2 * LAYOUT.chunk_bytes
    b_labels = {"tenant": "b", "model": "qwen-b"}
    assert value(admin, "kvstore_model_lookup_chunks_total", **b_labels) == 2
    assert value(admin, "kvstore_model_lookup_hit_chunks_total", **b_labels) == 0
    assert value(admin, "kvstore_model_get_chunks_total", **b_labels) == 1
    assert 'model="qwen-b",tier=' not in admin  # b's get found nothing: no tier served it


def test_a_tenant_sees_its_own_models_only(tenants_daemon: Daemon) -> None:
    url = tenants_daemon.url
    with KVStoreClient(url, token=TOKENS["a"], model="secret-model-of-a") as a:
        a.lookup_keys(a.chunk_keys(list(range(CHUNK))))
    with KVStoreClient(url, token=TOKENS["b"], model="secret-model-of-b") as b:
        b.lookup_keys(b.chunk_keys(list(range(CHUNK))))
    mine, theirs = scrape(url, TOKENS["a"]), scrape(url, TOKENS["b"])
    assert value(mine, "kvstore_model_lookups_total", model="secret-model-of-a") >= 1
    assert "secret-model-of-b" not in mine and "secret-model-of-a" not in theirs
    assert 'tenant="' not in mine + theirs  # no tenant names either
    scraper = scrape(url, SCRAPER)  # the scraper sees every model, summed over tenants, without tenant names
    assert value(scraper, "kvstore_model_lookups_total", model="secret-model-of-b") >= 1
    assert 'tenant="' not in scraper


def test_model_labels_are_capped_per_tenant(tenants_daemon: Daemon) -> None:
    """A client naming a new model on every request cannot grow /metrics without bound: past
    MAX_MODEL_LABELS models, a tenant's lookups count under "other"; the other tenant keeps its labels."""
    url = tenants_daemon.url
    body = {"keys": ["ab" * 16]}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKENS['b']}"}) as http:
        for i in range(MAX_MODEL_LABELS + 5):
            assert http.post("/v1/lookup", json=body, headers={MODEL_HEADER: f"flood-{i}"}).status_code == 200
    admin = scrape(url, ADMIN)
    b_models = {dict(labels)["model"] for (name, labels), _ in parse_samples(admin).items()
                if name == "kvstore_model_lookups_total" and ("tenant", "b") in labels}
    assert len(b_models) == MAX_MODEL_LABELS + 1 and OTHER_MODEL in b_models
    assert value(admin, "kvstore_model_lookups_total", tenant="b", model=OTHER_MODEL) >= 5
    with KVStoreClient(url, token=TOKENS["a"], model="late-model-of-a") as a:  # a's labels are its own
        a.lookup_keys(a.chunk_keys(list(range(CHUNK))))
    assert value(scrape(url, ADMIN), "kvstore_model_lookups_total", tenant="a", model="late-model-of-a") == 1


def test_clients_without_a_model_still_work_and_bad_names_are_refused(tenants_daemon: Daemon) -> None:
    url = tenants_daemon.url
    with KVStoreClient(url, token=TOKENS["a"]) as old:  # an old client: no header
        assert old.lookup_keys(old.chunk_keys(list(range(500, 500 + CHUNK)))) == 0
    assert value(scrape(url, ADMIN), "kvstore_model_lookups_total", tenant="a", model=UNNAMED_MODEL) >= 1
    reply = httpx.post(f"{url}/v1/lookup", json={"keys": ["ab" * 16]},
                       headers={"Authorization": f"Bearer {TOKENS['a']}", MODEL_HEADER: "x" * 300})
    assert reply.status_code == 400 and MODEL_HEADER in reply.json()["detail"]
    with pytest.raises(ConfigError, match="model_id"):
        KVStoreClient(url, token=TOKENS["a"], model="x" * 300)
    with KVStoreClient(url, token=TOKENS["a"], model='odd "name"\\ é') as odd:  # percent-encoded, then escaped
        odd.lookup_keys(odd.chunk_keys(list(range(CHUNK))))
    assert 'model="odd \\"name\\"\\\\ é"' in scrape(url, ADMIN)


def test_gets_after_a_restart_count_under_the_disk_tier(tmp_path: Path) -> None:
    """After a restart the host tier is empty: the first get is served by NVMe (and promotes), the next by host."""
    daemon = start_daemon(tmp_path, host_chunks=16)
    try:
        with KVStoreClient(daemon.url, model="m") as client:
            keys = client.chunk_keys(list(range(2 * CHUNK)))
            assert client.put_many(keys, [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)]).ok
        daemon.stop()
        daemon.start()
        for _ in range(2):
            with KVStoreClient(daemon.url, model="m") as client:
                assert client.get_many(keys, [client.empty_chunk() for _ in keys]) == [True, True]
        text = scrape(daemon.url)
        labels = {"tenant": "default", "model": "m"}
        assert value(text, "kvstore_model_get_hit_chunks_total", **labels, tier="nvme") == 2
        assert value(text, "kvstore_model_get_hit_chunks_total", **labels, tier="host") == 2
        assert value(text, "kvstore_model_get_hit_ratio", **labels, tier="nvme") == 0.5
    finally:
        daemon.close()
