"""The daemon's OpenAPI bodies are the message types' own schemas (service/openapi_bodies.py): every $ref
resolves, each JSON body names the Struct its route decodes, and bytes are described as the hex JSON sends."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
from fastapi import FastAPI

from kvstore import wire_types as wire
from service.cluster import cluster_router
from service.openapi_bodies import MESSAGES, add_message_schemas
from service.routes_data import data_router
from service.routes_segments import segments_router


async def _nobody() -> None:
    return None


def _document() -> dict[str, Any]:
    app = FastAPI(openapi_url=None)
    app.include_router(data_router(_nobody))  # type: ignore[arg-type]
    app.include_router(segments_router(_nobody))  # type: ignore[arg-type]
    app.include_router(cluster_router(), prefix="/v1")
    return add_message_schemas(app.openapi())


def test_every_ref_resolves_and_every_message_is_described() -> None:
    document = _document()
    refs = set(re.findall(r'"\$ref": "#/components/schemas/(\w+)"', json.dumps(document)))
    assert refs <= set(document["components"]["schemas"])
    assert {kind.__name__ for kind in MESSAGES} <= refs | {"ErrorAnswer", "HealthAnswer"}  # /healthz: service/app.py


def test_a_route_body_is_the_struct_it_decodes() -> None:
    document = _document()
    asked = {("/v1/lookup", "LookupRequest"), ("/v1/chunks/put", "PutRequest"), ("/v1/shm/segments/put", "SlotsRequest"),
             ("/v1/layouts", "RegisterRequest"), ("/v1/route", "RouteRequest")}
    for path, name in asked:
        schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{name}"}
        fields = {f.encode_name for f in msgspec.structs.fields(getattr(wire, name))}
        assert set(document["components"]["schemas"][name]["properties"]) == fields


def test_bytes_are_described_as_hex() -> None:
    schemas = _document()["components"]["schemas"]
    key = schemas["KeysRequest"]["properties"]["keys"]["items"]
    assert key == {"type": "string", "pattern": "^[0-9a-fA-F]{32}$"}
    assert re.fullmatch(key["pattern"], wire.encode(wire.KeysRequest(keys=[bytes(range(16))]), json=True)
                        .decode().split('"')[3])
    assert "contentEncoding" not in json.dumps(schemas)
