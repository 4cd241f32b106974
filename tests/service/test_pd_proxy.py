"""`kvstore pd-proxy` against stand-in engine servers (real uvicorn servers in child processes that record
what they receive): the prefill request asks for one token and the handoff, the decode request carries
the prefill's handoff, streams pass through unchanged, the least loaded instance is chosen, and a failed
prefill instance degrades to decode-side prefill without a failed request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.exposition import parse_samples, sample
from tests.helpers.pd_servers import ProxyServer, Standin, standins_up
from tests.helpers.waits import wait_until

PROMPT = [11, 12, 13, 14, 15]


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Standin]]:
    yield from standins_up(tmp_path_factory.mktemp("standins"), dict.fromkeys(("p1", "p2", "d1", "d2")))


@pytest.fixture(autouse=True)
def fresh(standins: dict[str, Standin]) -> Iterator[None]:
    for server in standins.values():
        server.control("reset")
    yield
    for server in standins.values():
        server.control("release")


@pytest.fixture
def proxy(standins: dict[str, Standin]) -> Iterator[ProxyServer]:
    with ProxyServer([standins["p1"], standins["p2"]], [standins["d1"], standins["d2"]]) as server:
        yield server


def _received(standins: dict[str, Standin], *names: str) -> list[dict[str, Any]]:
    return [r for name in names for r in standins[name].received()]


def test_prefill_asks_one_token_and_decode_carries_its_handoff(proxy: ProxyServer, standins: dict[str, Standin]) -> None:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 5, "temperature": 0.0,
            "kv_transfer_params": {"client_field": 7}}
    answer = httpx.post(f"{proxy.url}/v1/completions", json=body, timeout=30.0)
    assert answer.status_code == 200, answer.text
    [prefilled] = _received(standins, "p1", "p2")
    [decoded] = _received(standins, "d1", "d2")
    assert prefilled["body"]["max_tokens"] == 1 and prefilled["body"]["stream"] is False
    assert prefilled["body"]["kv_transfer_params"] == {"client_field": 7, "do_remote_decode": True}
    assert prefilled["body"]["prompt"] == PROMPT
    handoff = prefilled_answer_handoff(standins, prefilled)
    assert decoded["body"] == {**body, "kv_transfer_params": handoff}
    assert answer.json()["from"] in ("d1", "d2") and answer.json()["choices"][0]["text"].count(" ") == 5
    assert prefilled["request_id"] == decoded["request_id"] and decoded["request_id"].startswith("pd-")


def prefilled_answer_handoff(standins: dict[str, Standin], prefilled: dict[str, Any]) -> dict[str, Any]:
    """What the stand-in answered that prefill request: its handoff names it and the request's number."""
    name = next(n for n in ("p1", "p2") if prefilled in standins[n].received())
    return {"from": name, "request": standins[name].received().index(prefilled) + 1}


def test_chat_prefill_caps_both_token_limits(proxy: ProxyServer, standins: dict[str, Standin]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7,
            "stream_options": {"include_usage": True}}
    answer = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30.0)
    assert answer.status_code == 200, answer.text
    [prefilled] = _received(standins, "p1", "p2")
    [decoded] = _received(standins, "d1", "d2")
    assert prefilled["path"] == decoded["path"] == "/v1/chat/completions"
    assert prefilled["body"]["max_tokens"] == 1 and prefilled["body"]["max_completion_tokens"] == 1
    assert "stream_options" not in prefilled["body"]
    assert decoded["body"]["max_completion_tokens"] == 7 and decoded["body"]["stream_options"] == body["stream_options"]
    assert decoded["body"]["kv_transfer_params"]["from"] in ("p1", "p2")


def test_stream_passes_the_decode_sse_through_unchanged(proxy: ProxyServer, standins: dict[str, Standin]) -> None:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{proxy.url}/v1/completions", json=body, timeout=30.0) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        through_proxy = answer.read()
    [prefilled] = _received(standins, "p1", "p2")
    assert prefilled["body"]["stream"] is False and "stream_options" not in prefilled["body"]
    decoder = next(n for n in ("d1", "d2") if standins[n].received())
    [decoded] = standins[decoder].received()
    direct = httpx.post(f"{standins[decoder].url}/v1/completions", json=decoded["body"], timeout=30.0).content
    assert through_proxy == direct and through_proxy.endswith(b"data: [DONE]\n\n")
    assert through_proxy.count(b"data: {") == 6
    assert wait_until(lambda: proxy.state.num_in_flight == 0, 10.0)  # the stream's slot is freed at its end


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_least_loaded_instance_is_chosen(proxy: ProxyServer, standins: dict[str, Standin], role: str) -> None:
    """One request held on an instance: the next two go to the other one (round-robin would split them)."""
    names = ("p1", "p2") if role == "prefill" else ("d1", "d2")
    for name in names:
        standins[name].control("set", hold=True)
    held = threading.Thread(target=httpx.post, args=(f"{proxy.url}/v1/completions",),
                            kwargs={"json": {"prompt": "hold", "max_tokens": 2}, "timeout": 60.0})
    held.start()
    try:
        assert wait_until(lambda: sum(standins[n].num_held() for n in names) == 1, 30.0)
        busy = next(n for n in names if standins[n].num_held() == 1)
        idle = next(n for n in names if n != busy)
        for _ in range(2):
            assert httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2},
                              timeout=30.0).status_code == 200
        assert [r["body"]["prompt"] for r in standins[idle].received()] == [PROMPT, PROMPT]
        assert [r["body"]["prompt"] for r in standins[busy].received()] == ["hold"]
    finally:
        for name in names:
            standins[name].control("release")
        held.join(timeout=60)


@pytest.mark.parametrize("failure", ["status", "timeout"])
def test_a_failing_prefill_means_decode_computes_the_prompt(standins: dict[str, Standin], failure: str) -> None:
    prefill = standins["p1"]
    prefill.control("set", **({"fail": True} if failure == "status" else {"hold": True}))
    with ProxyServer([prefill], [standins["d1"]], prefill_timeout_s=0.5) as proxy:
        answer = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": "hold", "max_tokens": 3}, timeout=30.0)
        assert answer.status_code == 200, answer.text
        [decoded] = standins["d1"].received()
        assert "kv_transfer_params" not in decoded["body"] and decoded["body"]["max_tokens"] == 3
        assert proxy.state.metrics.total("prefill_fallbacks", reason=failure) == 1


def test_a_killed_prefill_instance_degrades_to_decode_side_prefill(tmp_path: Path, standins: dict[str, Standin]) -> None:
    prefill = Standin("doomed", tmp_path)
    with ProxyServer([prefill], [standins["d1"]], health_interval_s=60.0) as proxy:
        assert httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, timeout=30.0).status_code == 200
        prefill.kill()
        for _ in range(2):  # the first finds the port closed; the second skips the instance marked unhealthy
            answer = httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=30.0)
            assert answer.status_code == 200, answer.text
        first, *fallbacks = standins["d1"].received()
        assert "kv_transfer_params" in first["body"]
        assert [("kv_transfer_params" in r["body"]) for r in fallbacks] == [False, False]
        metrics = proxy.state.metrics
        assert metrics.total("prefill_fallbacks", reason="unreachable") == 1
        assert metrics.total("prefill_fallbacks", reason="no_prefill") == 1


def test_an_unhealthy_instance_is_skipped_until_it_answers_again(proxy: ProxyServer, standins: dict[str, Standin]) -> None:
    p1 = proxy.state.prefill.instances[0]
    standins["p1"].control("set", healthy=False)
    assert wait_until(lambda: not p1.is_healthy, 10.0)
    for _ in range(3):
        assert httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, timeout=30.0).status_code == 200
    assert not standins["p1"].received() and len(standins["p2"].received()) == 3
    standins["p1"].control("set", healthy=True)
    assert wait_until(lambda: p1.is_healthy, 10.0)
    for _ in range(3):
        assert httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, timeout=30.0).status_code == 200
    assert standins["p1"].received()


def test_models_come_from_a_decode_instance(proxy: ProxyServer) -> None:
    answer = httpx.get(f"{proxy.url}/v1/models", timeout=30.0)
    assert answer.status_code == 200
    assert answer.json()["data"][0]["id"] in ("standin-d1", "standin-d2")


def test_metrics_count_requests_fallbacks_and_in_flight(proxy: ProxyServer, standins: dict[str, Standin]) -> None:
    standins["p1"].control("set", fail=True)
    standins["p2"].control("set", fail=True)
    assert httpx.post(f"{proxy.url}/v1/completions", json={"prompt": PROMPT}, timeout=30.0).status_code == 200
    text = httpx.get(f"{proxy.url}/metrics", timeout=10.0).text
    assert sample(text, "kvstore_pd_requests_total", route="/v1/completions", status="200") == 1
    assert sample(text, "kvstore_pd_prefill_fallbacks_total", reason="status") == 1
    in_flight = {labels: v for (name, labels), v in parse_samples(text).items() if name == "kvstore_pd_instance_in_flight"}
    for name in ("p1", "p2", "d1", "d2"):
        role = "prefill" if name.startswith("p") else "decode"
        assert in_flight[frozenset({("role", role), ("instance", standins[name].url)})] == 0
    assert sample(text, "kvstore_pd_in_flight") == 0


def test_a_token_prompt_under_the_local_prefill_limit_skips_the_prefill(standins: dict[str, Standin]) -> None:
    with ProxyServer([standins["p1"]], [standins["d1"]], local_prefill_tokens=len(PROMPT)) as proxy:
        for prompt in (PROMPT[:-1], PROMPT, "a text prompt: its token count is unknown here"):
            assert httpx.post(f"{proxy.url}/v1/completions", json={"prompt": prompt}, timeout=30.0).status_code == 200
        assert [r["body"]["prompt"] for r in standins["p1"].received()] == [PROMPT, "a text prompt: its token count is unknown here"]
        decoded = standins["d1"].received()
        assert [("kv_transfer_params" in r["body"]) for r in decoded] == [False, True, True]
        assert proxy.state.metrics.total("local_prefills") == 1
        assert proxy.state.metrics.total("prefill_fallbacks") == 0
