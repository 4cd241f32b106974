"""One client request through the proxy: a prefill instance computes the prompt and answers with the
handoff (`kv_transfer_params`), then a decode instance answers the client with that handoff in its body.

    a prompt of token ids under --local-prefill-tokens -> straight to the decode instance, no handoff
    prefill failed (unreachable, timeout, any non-200, no handoff in the answer) or none healthy
        -> the decode request goes without a handoff: the decode instance computes the prompt itself
    decode failed (unreachable, timeout, 5xx) -> the next decode instance, least loaded first
    no decode instance answered -> 503 naming every instance tried and every one skipped as unhealthy
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from service.errors import ServiceError
from service.pd_proxy import upstream
from service.pd_proxy.bodies import decode_body, handoff_of, prefill_body
from service.pd_proxy.placement import prompt_token_ids
from service.pd_proxy.pool import Instance
from service.pd_proxy.state import ProxyState, Slot

logger = logging.getLogger(__name__)


class NoDecodeError(ServiceError):
    """No decode instance answered: all failed or were unhealthy. The detail names each one and why."""

    status = 503


async def generate(state: ProxyState, body: dict[str, object], *, path: str, headers: dict[str, str],
                   slot: Slot) -> Response:
    """Prefill (for the handoff) then decode; the decode instance's answer, streamed when the client asked.
    A token-id prompt under `local_prefill_tokens` skips the prefill."""
    token_ids = prompt_token_ids(body)
    if token_ids is not None and len(token_ids) < state.config.local_prefill_tokens:
        state.metrics.count("local_prefills")
        handoff, near_node_id = None, None
    else:
        handoff, near_node_id = await prefill(state, body, path=path, headers=headers)
    return await to_decode(state, "POST", path, decode_body(body, handoff), headers=headers, near_node_id=near_node_id,
                           stream=bool(body.get("stream")), slot=slot)


async def prefill(state: ProxyState, body: dict[str, object], *, path: str,
                  headers: dict[str, str]) -> tuple[dict[str, object] | None, str | None]:
    """The handoff from the first prefill instance in placement order and that instance's node; (None, None)
    when there is no healthy prefill instance or it failed (counted as a fallback, never raised)."""
    order = await state.placement.prefill_order(body)
    if not order:
        state.metrics.count("prefill_fallbacks", reason="no_prefill")
        return None, None
    instance = order[0]
    config = state.config
    request = upstream.build(state.client, instance, "POST", path, headers=headers,
                             timeout_s=upstream.timeout(config.connect_timeout_s, config.prefill_timeout_s),
                             body=prefill_body(body, is_chat=path.endswith("chat/completions")))
    try:
        with state.prefill.hold(instance):
            response = await upstream.send(state.client, instance, request)
    except upstream.UpstreamError as exc:
        if exc.kind == "unreachable":
            state.prefill.mark_failed(instance)
        return _fallback(state, exc.kind, str(exc))
    if response.status_code != 200:
        return _fallback(state, "status", f"prefill {instance.url} answered {response.status_code}")
    try:
        handoff = handoff_of(response.json())
    except ValueError:
        handoff = None
    if handoff is None:
        return _fallback(state, "no_handoff", f"prefill {instance.url} answered without kv_transfer_params")
    return handoff, instance.node_id


def _fallback(state: ProxyState, reason: str, detail: str) -> tuple[None, None]:
    """No handoff: counted, logged, and the decode instance computes the prompt itself. An answer without
    a handoff is normal where the connector saved nothing (e.g. a short prompt with save_partial_chunk off):
    logged at debug level only."""
    state.metrics.count("prefill_fallbacks", reason=reason)
    level = logging.DEBUG if reason == "no_handoff" else logging.WARNING
    logger.log(level, "%s: the decode instance computes the prompt itself", detail)
    return None, None


async def to_decode(state: ProxyState, method: str, path: str, body: dict[str, object] | None, *,
                    headers: dict[str, str], near_node_id: str | None, stream: bool, slot: Slot) -> Response:
    """`body` to the decode instances in placement order until one answers (a 4xx counts as an answer).

    Raises:
        NoDecodeError: none answered; the detail says which were tried and which skipped.
    """
    config = state.config
    tried: list[upstream.UpstreamError] = []
    for instance in state.placement.decode_order(near_node_id):
        request = upstream.build(state.client, instance, method, path, headers=headers, body=body,
                                 timeout_s=upstream.timeout(config.connect_timeout_s, config.decode_timeout_s))
        state.decode.begin(instance)
        try:
            response = await upstream.send(state.client, instance, request, stream=stream)
        except upstream.UpstreamError as exc:
            state.decode.end(instance)
            _decode_failed(state, exc, tried)
            continue
        except BaseException:
            state.decode.end(instance)
            raise
        if stream:
            return _streamed(state, instance, response, slot)
        state.decode.end(instance)
        return Response(response.content, status_code=response.status_code,
                        media_type=response.headers.get("content-type"))
    raise NoDecodeError(_no_decode_detail(state, tried))


def _decode_failed(state: ProxyState, exc: upstream.UpstreamError, tried: list[upstream.UpstreamError]) -> None:
    state.metrics.count("decode_failures", kind=exc.kind)
    if exc.kind == "unreachable":
        state.decode.mark_failed(exc.instance)
    logger.warning("%s: trying the next decode instance", exc)
    tried.append(exc)


def _no_decode_detail(state: ProxyState, tried: list[upstream.UpstreamError]) -> str:
    tried_instances = [exc.instance for exc in tried]
    skipped = [i.url for i in state.decode.instances if not i.is_healthy and i not in tried_instances]
    return (f"no decode instance answered; tried: {[str(exc) for exc in tried] or 'none'}; "
            f"skipped as unhealthy: {skipped or 'none'}. "
            f"Check the decode instances' /health (the proxy polls it every {state.config.health_interval_s:g} s)")


def _streamed(state: ProxyState, instance: Instance, response: httpx.Response, slot: Slot) -> StreamingResponse:
    """The decode instance's answer passed through piece by piece, unchanged (its SSE events included).
    The upstream answer, the instance's count and the client's slot are freed once, by whichever comes
    first: the stream's end or the response's background task (which runs even when the client left
    before the stream began)."""
    is_done = False

    async def finish() -> None:
        nonlocal is_done
        if not is_done:
            is_done = True
            state.decode.end(instance)
            slot.release()
            await response.aclose()

    async def pieces() -> AsyncIterator[bytes]:
        try:
            async for piece in response.aiter_raw():
                yield piece
        except httpx.HTTPError as exc:  # tokens went out already: nothing to fail over to
            state.metrics.count("decode_failures", kind="stream_broken")
            logger.warning("decode %s broke off its stream (%s)", instance.url, type(exc).__name__)
        finally:
            await finish()

    return StreamingResponse(pieces(), status_code=response.status_code, background=BackgroundTask(finish),
                             media_type=response.headers.get("content-type"))
