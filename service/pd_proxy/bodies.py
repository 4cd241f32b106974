"""The upstream request bodies made from a client's: the prefill request (one token, not streamed, asking
the connector for a handoff) and the decode request (the client's own, carrying the prefill's handoff).

The handoff (`kv_transfer_params`) is opaque here: vLLM's connector writes it into the prefill answer
and reads it from the decode request; the proxy only carries it across.
"""

from __future__ import annotations

from service.errors import BadRequestError

HANDOFF_FIELD = "kv_transfer_params"
PREFILL_ASK = {"do_remote_decode": True}  # what a prefill instance's connector is told about this request


def check_body(body: object, *, route: str) -> dict[str, object]:
    """The client's JSON body, which must be an object with the fields its route needs.

    Raises:
        BadRequestError: not an object, or no `prompt` (completions) / `messages` (chat).
    """
    if not isinstance(body, dict):
        raise BadRequestError(f"the body of {route} must be a JSON object, got {type(body).__name__}")
    needed = "messages" if route.endswith("chat/completions") else "prompt"
    if needed not in body:
        raise BadRequestError(f"{route} needs a {needed!r} field (OpenAI's {route} request)")
    if HANDOFF_FIELD in body and not isinstance(body[HANDOFF_FIELD], dict | None):
        raise BadRequestError(f"{HANDOFF_FIELD!r} must be a JSON object when given")
    return body


def prefill_body(body: dict[str, object], *, is_chat: bool) -> dict[str, object]:
    """The client's body for the prefill instance: one token, no stream, the handoff asked for."""
    out = {k: v for k, v in body.items() if k != "stream_options"}
    out["max_tokens"] = 1
    if is_chat:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    asked = body.get(HANDOFF_FIELD)  # a JSON object or None (check_body)
    out[HANDOFF_FIELD] = {**(asked if isinstance(asked, dict) else {}), **PREFILL_ASK}
    return out


def decode_body(body: dict[str, object], handoff: dict[str, object] | None) -> dict[str, object]:
    """The client's body for the decode instance: with the prefill's handoff, or without any (it then
    computes the prompt itself)."""
    out = {k: v for k, v in body.items() if k != HANDOFF_FIELD}
    if handoff is not None:
        out[HANDOFF_FIELD] = handoff
    return out


def handoff_of(answer: object) -> dict[str, object] | None:
    """The prefill answer's `kv_transfer_params` (None when it has none: the decode side computes)."""
    handoff = answer.get(HANDOFF_FIELD) if isinstance(answer, dict) else None
    return handoff if isinstance(handoff, dict) else None
