"""`kvstore pd-proxy`'s refusals: 429 past the in-flight cap, 413 past the body limit, 503 naming the decode
instances tried, 401 without the API key (which goes upstream as vLLM expects), bad bodies and options."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.process import free_port
from tests.helpers.pd_servers import ROOT, ProxyServer, Standin, standins_up
from tests.helpers.waits import wait_until

PROMPT = [21, 22, 23]


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Standin]]:
    yield from standins_up(tmp_path_factory.mktemp("standins"), {"p": None, "d": None, "dk": "sekrit"})


@pytest.fixture(autouse=True)
def fresh(standins: dict[str, Standin]) -> None:
    for server in standins.values():
        server.control("reset")


def test_requests_past_the_in_flight_cap_get_429_until_a_slot_frees(standins: dict[str, Standin]) -> None:
    standins["d"].control("set", hold=True)
    with ProxyServer([standins["p"]], [standins["d"]], max_in_flight=1) as proxy:
        held = threading.Thread(target=httpx.post, args=(f"{proxy.url}/v1/completions",),
                                kwargs={"json": {"prompt": "hold", "stream": True}, "timeout": 60.0})
        held.start()
        try:
            assert wait_until(lambda: standins["d"].num_held() == 1, 30.0)
            refused = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, timeout=30.0)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert "--max-in-flight 1" in refused.json()["detail"]
        finally:
            standins["d"].control("release")
            held.join(timeout=60)
        assert wait_until(lambda: proxy.state.num_in_flight == 0, 10.0)  # the streamed answer freed its slot
        assert httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, timeout=30.0).status_code == 200
        assert proxy.state.metrics.total("rejected", reason="in_flight_limit") == 1


def test_a_body_over_the_limit_gets_413_and_reaches_no_instance(standins: dict[str, Standin]) -> None:
    with ProxyServer([standins["p"]], [standins["d"]], max_body_bytes=1000) as proxy:
        answer = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": list(range(1000))}, timeout=30.0)
        assert answer.status_code == 413 and "--max-body-bytes" in answer.json()["detail"]
        chunked = httpx.post(f"{proxy.url}/v1/completions", content=iter([b'{"prompt": "', b"x" * 2000, b'"}']),
                             timeout=30.0)  # no Content-Length: counted as it is read
        assert chunked.status_code == 413
        assert not standins["p"].received() and not standins["d"].received()


def test_no_decode_instance_answering_is_a_503_naming_each(standins: dict[str, Standin]) -> None:
    standins["d"].control("set", fail=True)
    nobody = f"http://127.0.0.1:{free_port()}"
    with ProxyServer([standins["p"]], [standins["d"], nobody], health_interval_s=60.0) as proxy:
        assert wait_until(lambda: not proxy.state.decode.instances[1].is_healthy, 10.0)  # the first poll
        proxy.state.decode.instances[1].is_healthy = True  # as if it had died after that poll
        answer = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, timeout=30.0)
        assert answer.status_code == 503
        detail = answer.json()["detail"]
        assert standins["d"].url in detail and "status" in detail and nobody in detail and "unreachable" in detail
        again = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, timeout=30.0).json()["detail"]
        assert f"skipped as unhealthy: ['{nobody}']" in again  # marked at its failed call
        assert httpx.get(f"{proxy.url}/health", timeout=10.0).status_code == 200  # d still answers /health


def test_api_key_is_required_and_forwarded_upstream(standins: dict[str, Standin]) -> None:
    with ProxyServer([standins["p"]], [standins["dk"]], api_key="sekrit") as proxy:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic sekrit"}):
            answer = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, headers=headers, timeout=30.0)
            assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{proxy.url}/v1/models", timeout=30.0).status_code == 401
        assert not standins["p"].received() and not standins["dk"].received()
        ok = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT},
                        headers={"Authorization": "Bearer sekrit"}, timeout=30.0)
        assert ok.status_code == 200, ok.text  # dk answers 401 without the key
        assert [r["authorization"] for r in standins["p"].received() + standins["dk"].received()] == ["Bearer sekrit"] * 2
        assert httpx.get(f"{proxy.url}/health", timeout=10.0).status_code == 200  # health and metrics need no key
        assert proxy.state.metrics.total("rejected", reason="auth") == 4


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/v1/completions", b"not json", "not JSON"),
    ("/v1/completions", b"[1, 2]", "JSON object"),
    ("/v1/completions", b'{"messages": []}', "'prompt'"),
    ("/v1/chat/completions", b'{"prompt": "x"}', "'messages'"),
    ("/v1/completions", b'{"prompt": "x", "kv_transfer_params": 3}', "kv_transfer_params"),
])
def test_bad_bodies_get_400_naming_the_problem(standins: dict[str, Standin], path: str, body: bytes, words: str) -> None:
    with ProxyServer([standins["p"]], [standins["d"]]) as proxy:
        answer = httpx.post(f"{proxy.url}{path}", content=body, timeout=30.0)
        assert answer.status_code == 400 and words in answer.json()["detail"], answer.text
        assert proxy.state.num_in_flight == 0


def test_the_command_refuses_bad_instances_and_serves_good_ones(tmp_path: Path, standins: dict[str, Standin]) -> None:
    cli = [sys.executable, "-c", "from kvstore.cli import app; app()", "pd-proxy"]
    refused = subprocess.run([*cli, "--prefill", "localhost:8000", "--decode", standins["d"].url], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--prefill 'localhost:8000' is not an instance URL" in refused.stderr
    no_decode = subprocess.run([*cli, "--prefill", standins["p"].url], cwd=ROOT, capture_output=True, text=True,
                               timeout=120)
    assert no_decode.returncode == 2 and "--decode" in no_decode.stderr
    port = free_port()
    log = tmp_path / "proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*cli, "--prefill", standins["p"].url, "--decode", f"node-x={standins['d'].url}",
                                 "--port", str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: "ready at" in log.read_text(), 120.0, poll_s=0.1), log.read_text()
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": PROMPT}, timeout=30.0)
        assert answer.status_code == 200 and answer.json()["from"] == "d"
        assert standins["d"].received()[0]["body"]["kv_transfer_params"]["from"] == "p"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
