"""The daemon's config: the [service] table beside the store config, tenants, validation, safe binding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstore.errors import ConfigError
from service.config import load_daemon_config, service_config_from_dict
from service.daemon import serve
from service.exposition import gauge, render, sample
from service.metrics import RequestMetrics, store_families

STORE = """
model_id = "llama-3-8b"
[[tiers]]
kind = "host"
capacity = "64MiB"
"""


def test_service_table_loads_beside_the_store_config(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text(STORE + """
[service]
max_body_bytes = "8MiB"
lease_s = 5
[[service.tenants]]
name = "a"
token_env = "A_TOKEN"
salt = "sa"
shm = true
quota = { host = "1GiB", nvme = "4GiB" }
""")
    store, service = load_daemon_config(path, env={"A_TOKEN": "secret-token-a", "KVSTORE_CACHE_DIR": str(tmp_path)})
    assert store.model_id == "llama-3-8b" and store.tiers[0].capacity_bytes == 64 << 20
    assert service.max_body_bytes == 8 << 20 and service.lease_s == 5.0 and service.auth_enabled
    tenant = service.tenants[0]
    assert (tenant.token, tenant.shm, tenant.quota_limit_bytes) == ("secret-token-a", True, 1 << 30)


@pytest.mark.parametrize(("service", "words"), [
    ("lease = 3", "unknown keys ['lease']"),
    ("lease_s = -1", "lease_s must be positive"),
    ('shm_plane = "arena"', 'the "arena" shared-memory plane is retired: the default "segments" plane replaces it'),
    ('shm_plane = "disk"', "remove service.shm_plane"),
    ("max_pin_s = 2.0", "remove service.max_pin_s"),
    ('shm_name = "kv"', "remove service.shm_name"),
    ('[[service.tenants]]\nname = "a"\ntoken = "short"\nsalt = "s"', "at least 8"),
    ('[[service.tenants]]\nname = "a"\ntoken_env = "NOPE"\nsalt = "s"', "NOPE"),
    ('[[service.tenants]]\nname = "a"\ntoken = "tok-aaaaaaaa"\nsalt = "s"\n'
     '[[service.tenants]]\nname = "b"\ntoken = "tok-bbbbbbbb"\nsalt = "s"', "distinct salt"),
    ('[[service.tenants]]\nname = "a"\ntoken = "tok-aaaaaaaa"\nsalt = "s"\nquota = { disk = 5 }', "unknown tier"),
])
def test_bad_service_config_is_named(tmp_path: Path, service: Any, words: Any) -> None:
    path = tmp_path / "kv.toml"
    path.write_text(STORE + "[service]\n" + service + "\n")
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_daemon_config(path, env={"KVSTORE_CACHE_DIR": str(tmp_path)})


def test_refuses_a_public_address_without_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kv.toml"
    path.write_text(STORE)
    monkeypatch.setenv("KVSTORE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="without auth"):
        serve(path, host="0.0.0.0", port=1)


def test_prometheus_lines() -> None:
    text = render(store_families({"chunks": 3, "puts": 5, "tiers": {"host": {"used_bytes": 10, "hits": 2}}})).decode()
    assert sample(text, "kvstore_tier_used_bytes", tier="host") == 10 and "# TYPE kvstore_tier_used_bytes gauge" in text
    assert sample(text, "kvstore_tier_hits_total", tier="host") == 2 and "# TYPE kvstore_tier_hits_total counter" in text
    assert sample(text, "kvstore_chunks") == 3 and sample(text, "kvstore_puts_total") == 5
    requests = RequestMetrics()
    requests.observe("/v1/lookup", "POST", 200, 0.0015)
    text = render(requests.families()).decode()
    bucket = "kvstore_http_request_duration_seconds_bucket"
    labels = {"route": "/v1/lookup", "method": "POST"}
    assert [sample(text, bucket, **labels, le=le) for le in ("0.001", "0.002", "+Inf")] == [0, 1, 1]
    assert sample(text, "kvstore_http_requests_total", **labels, status="200") == 1


def test_label_values_are_escaped() -> None:
    """A label value with a quote, a backslash or a newline (a model name, an instance URL) stays one sample."""
    model = 'odd"model\\with\nnewline'
    text = render([gauge("kvstore_x", "x", [((model,), 1)], ("model",))]).decode()
    assert sample(text, "kvstore_x", model=model) == 1


def test_unknown_service_key_lists_every_accepted_key() -> None:
    """Regression (issue 25): the "valid:" list left out admin_token_env and metrics_token_env."""
    with pytest.raises(ConfigError) as caught:
        service_config_from_dict({"lease": 3})
    for key in ("admin_token_env", "metrics_token_env", "admin_token", "lease_s", "tenants"):
        assert f"'{key}'" in str(caught.value)


def test_the_daemons_lookup_timeout_has_a_name_of_its_own(caplog: pytest.LogCaptureFixture) -> None:
    """`lookup_timeout_s` is an engine option (connector/deadlines.py); the daemon's is shared_lookup_timeout_s,
    and its old name still loads, with a warning that names the new one."""
    assert service_config_from_dict({"shared_lookup_timeout_s": 0.25}).shared_lookup_timeout_s == 0.25
    with caplog.at_level("WARNING", logger="service.config"):
        assert service_config_from_dict({"lookup_timeout_s": 0.75}).shared_lookup_timeout_s == 0.75
    assert "shared_lookup_timeout_s" in caplog.text
