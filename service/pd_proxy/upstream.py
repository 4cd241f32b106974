"""One call to an upstream OpenAI server, with its failure sorted into a kind the proxy acts on.

    unreachable  connection refused or reset: the instance is marked unhealthy until /health answers
    timeout      no answer within the call's timeout
    status       an answer with a 5xx status (a 4xx is the client's and passes through unchanged)
"""

from __future__ import annotations

import httpx

from service.pd_proxy.pool import Instance

DETAIL_CHARS = 300  # of an upstream's error body, quoted in the proxy's own answers and logs


class UpstreamError(Exception):
    """A call to `instance` failed; `kind` is unreachable, timeout or status."""

    def __init__(self, instance: Instance, kind: str, detail: str) -> None:
        super().__init__(f"{instance.role.value} {instance.url}: {kind} ({detail})")
        self.instance = instance
        self.kind = kind
        self.detail = detail


def timeout(connect_s: float, read_s: float) -> httpx.Timeout:
    return httpx.Timeout(read_s, connect=connect_s)


async def send(client: httpx.AsyncClient, instance: Instance, request: httpx.Request, *,
               stream: bool = False) -> httpx.Response:
    """Send `request` to `instance`; the answer unless it failed (then closed).

    Raises:
        UpstreamError: unreachable, timed out, or a 5xx answer.
    """
    try:
        response = await client.send(request, stream=stream)
    except httpx.TimeoutException as exc:
        raise UpstreamError(instance, "timeout", type(exc).__name__) from exc
    except httpx.HTTPError as exc:
        raise UpstreamError(instance, "unreachable", f"{type(exc).__name__}: {exc}"[:DETAIL_CHARS]) from exc
    if response.status_code >= 500:
        body = await response.aread()
        await response.aclose()
        raise UpstreamError(instance, "status", f"{response.status_code}: {body[:DETAIL_CHARS].decode(errors='replace')}")
    return response


def build(client: httpx.AsyncClient, instance: Instance, method: str, path: str, *, headers: dict[str, str],
          timeout_s: httpx.Timeout, body: object = None) -> httpx.Request:
    """The request for `path` on `instance` (JSON `body` when given)."""
    return client.build_request(method, instance.url + path, json=body, headers=headers, timeout=timeout_s)
