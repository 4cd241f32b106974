"""Trust boundaries of a real daemon: every route needs a token except /healthz (which shows no
configuration), the API docs take the token as Bearer or as the Basic password, /metrics has its own token and per-tenant series only for the admin, /v1/stats is
scoped to the caller, the admin token is no tenant, and no token reaches the daemon's log."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from connector.client import KVStoreClient
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, TOKENS, start_daemon

ADMIN = "admin-token-0123456789"
SCRAPER = "metrics-token-0123456789"
KEY = "ab" * 16


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("secured")
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a", "shm": True},
               {"name": "b", "token": TOKENS["b"], "salt": "salt-b"}]
    d = start_daemon(root, tenants=tenants, service={"admin_token": ADMIN, "metrics_token": SCRAPER})
    yield d
    d.close()


def _operations(url: str) -> list[tuple[str, str]]:
    schema = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {TOKENS['a']}"}).json()
    return [(method.upper(), path.replace("{key}", KEY)) for path, ops in schema["paths"].items() for method in ops]


def test_every_route_but_healthz_needs_a_token(secured: Any) -> None:
    operations = _operations(secured.url)
    assert len(operations) >= 12
    with httpx.Client(base_url=secured.url) as http:
        for method, path in operations:
            reply = http.request(method, path, json={})
            expected = 200 if path == "/healthz" else 401
            assert reply.status_code == expected, f"{method} {path}: {reply.status_code} {reply.text[:200]}"
        assert http.get("/metrics").status_code == 401


def test_healthz_shows_no_configuration(secured: Any) -> None:
    assert httpx.get(f"{secured.url}/healthz").json() == {"status": "ready"}


def test_stats_are_scoped_to_the_caller(secured: Any) -> None:
    with KVStoreClient(secured.url, token=TOKENS["a"]) as a, KVStoreClient(secured.url, token=TOKENS["b"]) as b:
        keys = a.chunk_keys(list(range(2 * LAYOUT.chunk_tokens)))
        assert a.put_many(keys, [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)]).ok
        mine, theirs = a.stats(), b.stats()
    assert mine["tenant"]["name"] == "a" and mine["tenant"]["chunks"] == 2
    assert theirs["tenant"]["chunks"] == 0
    for view in (mine, theirs):  # nothing about the store as a whole or about other tenants
        assert "tiers" not in view and "tenants" not in view and "chunks" not in view
        assert ("a" if view is theirs else "b") not in str(view.get("tenants", ""))
    admin = httpx.get(f"{secured.url}/v1/stats", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert set(admin["tenants"]) == {"a", "b"} and admin["tenants"]["a"]["chunks"] == 2
    assert admin["tiers"]["host"]["chunks"] >= 2


def test_metrics_token_and_admin_only_tenant_series(secured: Any) -> None:
    def metrics(token: str) -> httpx.Response:
        return httpx.get(f"{secured.url}/metrics", headers={"Authorization": f"Bearer {token}"})

    scraper, admin, tenant = metrics(SCRAPER), metrics(ADMIN), metrics(TOKENS["b"])
    assert scraper.status_code == admin.status_code == tenant.status_code == 200
    assert "kvstore_tier_used_bytes" in scraper.text
    assert "kvstore_tenant_bytes" not in scraper.text and "kvstore_tenant_bytes" not in tenant.text
    assert 'kvstore_tenant_bytes{tenant="a"}' in admin.text
    assert metrics("wrong-token-123456789").status_code == 401


def test_role_tokens_are_not_tenants(secured: Any) -> None:
    for token in (ADMIN, SCRAPER):
        reply = httpx.post(f"{secured.url}/v1/lookup", json={"keys": [KEY]},
                           headers={"Authorization": f"Bearer {token}"})
        assert reply.status_code == 403 and "tenant" in reply.json()["detail"]
    scraper_stats = httpx.get(f"{secured.url}/v1/stats", headers={"Authorization": f"Bearer {SCRAPER}"}).json()
    assert set(scraper_stats) == {"service"}


def test_no_token_in_the_log(secured: Any) -> None:
    with httpx.Client(base_url=secured.url) as http:  # failures are what get logged: provoke some
        http.get("/v1/info", headers={"Authorization": f"Bearer {TOKENS['a']}x"})
        http.get("/metrics", headers={"Authorization": "Bearer nope"})
    log = secured.log.read_text()
    for secret in (*TOKENS.values(), ADMIN, SCRAPER):
        assert secret not in log


DOCS = ("/docs", "/openapi.json", "/docs/assets/swagger-ui-bundle.js")


def test_docs_without_a_right_token_are_401_with_a_basic_challenge(secured: Any) -> None:
    wrong = [{}, {"auth": ("", "wrong-token-123456789")}, {"auth": (TOKENS["a"], "")},
             {"headers": {"Authorization": "Basic !!not-base64!!"}},
             {"headers": {"Authorization": "Bearer wrong-token-123456789"}}]
    with httpx.Client(base_url=secured.url) as http:
        for path in DOCS:
            for kwargs in wrong:
                reply = http.get(path, **kwargs)  # type: ignore[arg-type]
                assert reply.status_code == 401, f"{path} {kwargs}: {reply.status_code}"
                assert reply.headers["www-authenticate"] == 'Basic realm="kvstore"'
                assert "openapi" not in reply.text and "paths" not in reply.text
        assert "-u" in http.get("/docs").json()["detail"]  # the message says how to send the token


def test_docs_page_and_its_schema_fetch_work_with_the_basic_token(secured: Any) -> None:
    """What a browser does: prompted on /docs, it sends the token as the Basic password, then the same
    credentials with the page's assets and its fetch of the schema URL written into the page."""
    with httpx.Client(base_url=secured.url, auth=("kvstore", TOKENS["b"])) as browser:
        page = browser.get("/docs")
        assert page.status_code == 200 and "swagger" in page.text.lower()
        schema_url = re.search(r"url: '([^']+)'", page.text)
        assert schema_url is not None, page.text[:500]
        schema = browser.get(schema_url.group(1))
        assert schema.status_code == 200 and "/v1/lookup" in schema.json()["paths"]
        for asset in re.findall(r'(?:src|href)="(/docs/assets/[^"]+)"', page.text):
            assert browser.get(asset).status_code == 200, asset
        assert browser.get("/docs/assets/..%2Fpyproject.toml").status_code == 404
        assert browser.get("/v1/stats").status_code == 401  # Basic is for the docs only


def test_docs_take_any_role_as_bearer(secured: Any) -> None:
    for token in (TOKENS["a"], ADMIN, SCRAPER):
        reply = httpx.get(f"{secured.url}/openapi.json", headers={"Authorization": f"Bearer {token}"})
        assert reply.status_code == 200 and reply.json()["info"]["title"] == "kvstore"
