"""The OpenAPI bodies of the daemon's routes, generated from the message types of kvstore/wire_types.py.

One definition serves the wire and the docs: `msgspec.json.schema_components` writes each Struct's JSON Schema
into the OpenAPI document's components, as its JSON form travels (every bytes value a hex string; msgpack
bodies carry the same fields with raw bytes). Routes name their bodies with `request_body(Kind)` and
`answer(Kind)`; `add_message_schemas` puts the components into the document the daemon serves.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvstore import wire_types as wire

REF = "#/components/schemas/{name}"
MESSAGES: tuple[type[wire.Message], ...] = (
    wire.RegisterRequest, wire.LookupRequest, wire.RouteRequest, wire.KeysRequest, wire.PutRequest,
    wire.SegmentRequest, wire.SlotsRequest, wire.SegmentCloseRequest, wire.InfoAnswer, wire.RegisterAnswer,
    wire.LookupAnswer, wire.PutAnswer, wire.GetAnswer, wire.FoundAnswer, wire.RemovedAnswer, wire.RemovedManyAnswer,
    wire.SegmentAnswer, wire.ClosedAnswer, wire.RouteAnswer, wire.HealthAnswer, wire.NodesAnswer, wire.EventsAnswer,
    wire.ErrorAnswer,
)
HEX = "^([0-9a-fA-F]{2})*$"


def _hexed(schema: Any) -> Any:
    """`schema` with every bytes value (msgspec: a base64 string) as the hex string the JSON form sends."""
    if isinstance(schema, list):
        return [_hexed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("contentEncoding") != "base64":
        return {key: _hexed(value) for key, value in schema.items()}
    # msgspec's lengths count base64 characters; a pattern (the type's own, e.g. a key's 32 digits) says the hex
    return {"pattern": HEX, **{k: v for k, v in schema.items() if k not in ("contentEncoding", "minLength", "maxLength")}}


def _any(kind: type) -> dict[str, Any]:
    if kind is object:  # HealthAnswer.cluster's values: any JSON value
        return {"description": "any JSON value"}
    raise NotImplementedError(f"no JSON Schema for {kind}")


_, _COMPONENTS = msgspec.json.schema_components(MESSAGES, schema_hook=_any, ref_template=REF)
SCHEMAS: dict[str, Any] = _hexed(_COMPONENTS)


def _ref(kind: type[wire.Message]) -> dict[str, str]:
    assert kind.__name__ in SCHEMAS, f"{kind.__name__} is not in MESSAGES"
    return {"$ref": REF.format(name=kind.__name__)}


def request_body(kind: type[wire.Message]) -> dict[str, Any]:
    """A route's `openapi_extra`: its JSON body is a `kind` (msgpack with the same fields is accepted too)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _ref(kind)}}}}


def answer(kind: type[wire.Message]) -> dict[int | str, dict[str, Any]]:
    """A route's `responses`: a `kind` in JSON (or msgpack when Accept asks for it)."""
    return {200: {"description": kind.__doc__.splitlines()[0] if kind.__doc__ else kind.__name__,
                  "content": {"application/json": {"schema": _ref(kind)}}}}


def add_message_schemas(document: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with the messages' schemas among its components (where the routes' $refs point)."""
    document.setdefault("components", {}).setdefault("schemas", {}).update(SCHEMAS)
    return document
