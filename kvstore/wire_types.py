"""The daemon's messages: every structured request and answer body of `kvstore serve`, declared once.

Both ends import these msgspec Structs: the daemon (service/) decodes requests and encodes answers
with them, the client (connector/) encodes requests and decodes answers. Two encodings, one rule each:

    msgpack   bytes travel raw (chunk keys as 16-byte bins, chunk data as one bin)
    JSON      every bytes value is a hex string (a chunk key is 32 hex characters)

`decode` checks a body against its Struct (types, key lengths, non-negative token ids) and raises
`WireError` naming the field; `encode` writes either form. `PutAnswer` is the one place a
`PutResult` becomes a message and back.

A client registers the model it computes for and its KV layout once (`RegisterRequest`, POST
/v1/layouts); its segments, token lookups and HTTP chunk bodies then name that layout by fingerprint
(`layout`, 16 hex digits; absent: the daemon's default layout), so one daemon serves every model.

The model a client computes for rides on every request as one header, `MODEL_HEADER` (percent-encoded
UTF-8, `model_header` / `model_of_header`): chunk keys are hashes, so the daemon learns the model only
from it, for its per-model hit counts. Clients that send none are counted under `UNNAMED_MODEL`.
"""

from __future__ import annotations

import functools
import urllib.parse
from typing import Annotated, Any, ClassVar, TypeVar

import msgspec

from kvstore.errors import ConfigError
from kvstore.hashing import KEY_BYTES
from kvstore.layout import AttentionKind, KVLayout
from kvstore.types import PutResult

MSGPACK = "application/msgpack"

Key = Annotated[bytes, msgspec.Meta(min_length=KEY_BYTES, max_length=KEY_BYTES, extra_json_schema={  # JSON: hex
    "pattern": f"^[0-9a-fA-F]{{{2 * KEY_BYTES}}}$"})]
TokenId = Annotated[int, msgspec.Meta(ge=0)]
KEYS_HINT = f"'keys' (a list of chunk keys of {KEY_BYTES} bytes; 32 hex characters in JSON)"
TOKENS_HINT = "'token_ids' (a 1-D list of non-negative ints)"
MODEL_HEADER = "X-KV-Model"
MAX_MODEL_CHARS = 256
UNNAMED_MODEL = "unknown"  # the model of requests that name none (clients from before MODEL_HEADER)


class Message(msgspec.Struct, kw_only=True):
    """A body of the daemon's API. `HINT` says what a valid one holds (appended to decode errors)."""

    HINT: ClassVar[str] = ""


LAYOUT_HINT = "'layout' (the fingerprint a registration answered, 16 hex digits; absent: the daemon's default)"
Positive = Annotated[int, msgspec.Meta(ge=1)]


# ----- requests -----------------------------------------------------------------------------------
class LayoutSpec(Message):
    """A model's KV layout (kvstore.layout.KVLayout's fields; `kind` "mha" or "mla")."""

    num_layers: Positive
    num_kv_heads: Positive
    head_dim: Positive
    dtype: str
    chunk_tokens: Positive
    kind: str = "mha"

    @classmethod
    def of(cls, layout: KVLayout) -> LayoutSpec:
        return cls(num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads, head_dim=layout.head_dim,
                   dtype=layout.dtype, chunk_tokens=layout.chunk_tokens, kind=layout.kind.value)

    def to_layout(self) -> KVLayout:
        """The KVLayout; ConfigError naming the field when it is not a valid one."""
        try:
            kind = AttentionKind(self.kind)
        except ValueError:
            raise ConfigError(f"layout kind {self.kind[:20]!r} is not one of {[k.value for k in AttentionKind]}") from None
        return KVLayout(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                        dtype=self.dtype, chunk_tokens=self.chunk_tokens, kind=kind)


class RegisterRequest(Message):
    """POST /v1/layouts: the model a client computes for ("" for none) and its KV layout, served from then on.
    One model name keeps one layout per tenant: another layout under the same name is refused (422)."""

    HINT: ClassVar[str] = ("send 'model' (the model's name or id) and 'layout' (num_layers, num_kv_heads, head_dim, "
                           "dtype, chunk_tokens, kind)")
    layout: LayoutSpec
    model: str = ""


class LookupRequest(Message):
    """POST /v1/lookup: the prompt's token ids, or chunk keys, of `layout` (its chunk tokens chunk the ids and
    count the hit tokens)."""

    HINT: ClassVar[str] = f"send {TOKENS_HINT} or {KEYS_HINT}, and {LAYOUT_HINT}"
    token_ids: list[TokenId] | None = None
    keys: list[Key] | None = None
    layout: str | None = None


class RouteRequest(LookupRequest):
    """POST /v1/route: a lookup, optionally among `nodes` only."""

    HINT: ClassVar[str] = f"send {TOKENS_HINT} or {KEYS_HINT}, and optionally 'nodes' (a list of node ids)"
    nodes: list[str] | None = None


class KeysRequest(Message):
    """POST /v1/chunks/get (chunks of `layout`) and /v1/chunks/delete."""

    HINT: ClassVar[str] = f"send {KEYS_HINT} and for a get {LAYOUT_HINT}"
    keys: list[Key]
    layout: str | None = None


class PutRequest(Message):
    """POST /v1/chunks/put: `len(keys)` chunks laid end to end in `data`, of the layout `layout` names."""

    HINT: ClassVar[str] = f"send {KEYS_HINT}, 'data' (the chunks' bytes end to end; hex in JSON) and 'layout' (the fingerprint)"
    keys: list[Key]
    data: memoryview  # msgpack: a view of the request body (no copy)
    layout: str | None = None


class SegmentRequest(Message):
    """POST /v1/shm/segments: a staging segment of `slots` chunk slots of `layout`."""

    HINT: ClassVar[str] = f"send 'slots' (the number of chunk slots, an int) and {LAYOUT_HINT}"
    slots: int
    layout: str | None = None


class SlotsRequest(Message):
    """POST /v1/shm/segments/put and /get: chunk `keys[i]` in slot `slots[i]` of `segment`."""

    HINT: ClassVar[str] = f"send 'segment' (its id), {KEYS_HINT} and 'slots' (one slot number per key)"
    segment: str
    keys: list[Key]
    slots: list[int]


class SegmentCloseRequest(Message):
    """POST /v1/shm/segments/close."""

    HINT: ClassVar[str] = "send 'segment' (the id of the segment to close)"
    segment: str


# ----- answers ------------------------------------------------------------------------------------
class InfoAnswer(Message):
    """GET /v1/info. `layout` is the daemon's default layout (the one a client that registers none uses);
    `any_layout`: every registered layout is served too. `shm_plane` is "segments" or None."""

    tenant: str
    model_id: str
    layout: dict[str, Any]
    layout_fingerprint: str
    chunk_bytes: int
    root_key: bytes
    instance: str
    shm_plane: str | None
    lease_s: float
    max_batch_chunks: int
    max_body_bytes: int
    any_layout: bool = False


class RegisterAnswer(Message):
    """POST /v1/layouts: the layout's fingerprint (to name it in later requests) and its chunk bytes."""

    layout_fingerprint: str
    chunk_bytes: int


class LookupAnswer(Message):
    """POST /v1/lookup: the leading held chunks."""

    num_tokens: int
    num_chunks: int
    keys: list[bytes]


class PutAnswer(Message):
    """Every put's answer: the wire form of `PutResult` (converted only by `of` and `to_result`)."""

    stored: list[bytes]
    not_stored: dict[bytes, str]
    not_replicated: dict[bytes, str]
    durable: bool

    @classmethod
    def of(cls, result: PutResult) -> PutAnswer:
        """The answer to a put that did `result`; durable when every chunk is stored with its disk copy."""
        return cls(stored=result.stored, not_stored=result.not_stored, not_replicated=result.not_replicated,
                   durable=not result.not_replicated and not result.not_stored)

    def to_result(self) -> PutResult:
        return PutResult(stored=self.stored, not_stored=self.not_stored, not_replicated=self.not_replicated)


class GetAnswer(Message):
    """POST /v1/chunks/get (msgpack or JSON): a flag per key, the found chunks' bytes end to end."""

    found: list[bool]
    data: bytes


class FoundAnswer(Message):
    """POST /v1/shm/segments/get: a flag per key (found chunks are in their slots)."""

    found: list[bool]


class RemovedAnswer(Message):
    """DELETE /v1/chunks/{key}."""

    removed: bool


class RemovedManyAnswer(Message):
    """POST /v1/chunks/delete: a flag per key."""

    removed: list[bool]


class SegmentAnswer(Message):
    """POST /v1/shm/segments: the segment's id, the unix socket that hands over its descriptor, its shape."""

    id: str
    socket: str
    slots: int
    slot_bytes: int


class ClosedAnswer(Message):
    """POST /v1/shm/segments/close."""

    closed: bool


class RouteAnswer(Message):
    """POST /v1/route: the node with the longest cached prefix (None when no node is live)."""

    node_id: str | None
    cached_tokens: int
    cached_tokens_by_node: dict[str, int]


class HealthAnswer(Message, omit_defaults=True):
    """GET /healthz; `cluster` only inside a cluster."""

    status: str
    cluster: dict[str, object] | None = None


class NodeEntry(Message):
    node_id: str
    load: float
    url: str


class NodesAnswer(Message):
    """GET /v1/cluster/nodes."""

    nodes: list[NodeEntry]


class EventEntry(Message):
    id: str
    node_id: str
    kind: str
    tier: str | None
    key: str | None  # hex: the stream's keys are shown, never sent back


class EventsAnswer(Message):
    """GET /v1/cluster/events: one page of the stream, and the id to continue from."""

    last_id: str
    events: list[EventEntry]


class TenantSummary(Message):
    """A tenant in /v1/stats."""

    name: str
    used_bytes: int
    quota_bytes: int | None
    chunks: int
    fast_lookups: int
    memory_bytes: int  # its memory budget (service/memory_budget.py): charged now, and the limit
    memory_limit_bytes: int
    segments: int  # its open shared-memory segments


class ErrorAnswer(Message):
    """Every 4xx/5xx answer: the error's class name and what to do (always JSON)."""

    error: str
    detail: str


# ----- the model header ---------------------------------------------------------------------------
def model_header(model: str) -> str:
    """`model` as MODEL_HEADER's value (percent-encoded: any name fits a latin-1 header).

    Raises:
        WireError: the name is empty or longer than MAX_MODEL_CHARS.
    """
    _check_model(model)
    return urllib.parse.quote(model, safe="/:@+")


def model_of_header(value: str | None) -> str:
    """The model a MODEL_HEADER value names (UNNAMED_MODEL when absent); WireError when it is not valid."""
    if value is None:
        return UNNAMED_MODEL
    try:
        model = urllib.parse.unquote(value, errors="strict") if "%" in value else value
    except UnicodeDecodeError:
        raise WireError(f"{MODEL_HEADER} is not percent-encoded UTF-8; send the model's name so encoded") from None
    _check_model(model)
    return model


def _check_model(model: str) -> None:
    if not model or len(model) > MAX_MODEL_CHARS or not model.isprintable():
        raise WireError(f"{MODEL_HEADER} names a model of {len(model)} characters{'' if model.isprintable() else ' with control characters'}; "
                        f"send 1 to {MAX_MODEL_CHARS} printable characters (the model_id option names the weights "
                        f"shortly)")


# ----- codec --------------------------------------------------------------------------------------
class WireError(ValueError):
    """A body that is not the message it should be; the text names the field and the fix."""


M = TypeVar("M", bound=Message)


def encode(message: Message | dict[str, object], *, json: bool = False) -> bytes:
    """msgpack (bytes raw), or JSON with every bytes value as hex."""
    if not json:
        return _MSGPACK_ENCODER.encode(message)
    return _JSON_ENCODER.encode(_hexed(msgspec.to_builtins(message, builtin_types=_BYTES_TYPES)))


def decode(body: bytes | memoryview, kind: type[M], *, json: bool = False) -> M:
    """`body` as a `kind`; WireError naming the field otherwise. An empty JSON body is an empty object."""
    try:
        if not json:
            return _msgpack_decoder(kind).decode(body)
        data = _JSON_DECODER.decode(body) if len(body) else {}
        return msgspec.convert(_unhexed(data, _type_info(kind)), kind)
    except msgspec.ValidationError as exc:  # a DecodeError too: first
        raise WireError(f"body is not a valid {kind.__name__} map/object: {exc}; {kind.HINT}") from None
    except msgspec.DecodeError as exc:
        form = "JSON" if json else "msgpack"
        raise WireError(f"body is not valid {form} ({exc}); send {form} (Content-Type: "
                        f"{'application/json' if json else MSGPACK})") from None
    except RecursionError:
        raise WireError("body is nested too deeply; send a flat map of lists") from None


_BYTES_TYPES = (bytes, bytearray, memoryview)
_BYTES_INFO = (msgspec.inspect.BytesType, msgspec.inspect.ByteArrayType, msgspec.inspect.MemoryViewType)
_MSGPACK_ENCODER = msgspec.msgpack.Encoder()
_JSON_ENCODER = msgspec.json.Encoder()
_JSON_DECODER = msgspec.json.Decoder()


@functools.cache
def _msgpack_decoder(kind: type[Message]) -> msgspec.msgpack.Decoder[Any]:
    return msgspec.msgpack.Decoder(kind)


@functools.cache
def _type_info(kind: type[Message]) -> msgspec.inspect.Type:
    return msgspec.inspect.type_info(kind)


def _hexed(value: object) -> object:
    if isinstance(value, _BYTES_TYPES):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {(k.hex() if isinstance(k, bytes) else k): _hexed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hexed(v) for v in value]
    return value


def _unhexed(value: object, info: msgspec.inspect.Type) -> object:
    """`value` (decoded JSON) with the hex strings where `info` wants bytes made bytes."""
    if isinstance(info, msgspec.inspect.Metadata):  # a type with its JSON Schema extras (Key)
        info = info.type
    if isinstance(info, _BYTES_INFO) and isinstance(value, str):
        try:
            return bytes.fromhex(value)
        except ValueError:
            raise WireError(f"{value[:40]!r} is not hex; in JSON, bytes (keys, data) are hex strings, or "
                            f"send msgpack ({MSGPACK}) for raw bytes") from None
    if isinstance(info, msgspec.inspect.UnionType):
        return next((_unhexed(value, t) for t in info.types if not isinstance(t, msgspec.inspect.NoneType)), value)
    if isinstance(info, msgspec.inspect.ListType) and isinstance(value, list):
        return [_unhexed(v, info.item_type) for v in value]
    if isinstance(info, msgspec.inspect.DictType) and isinstance(value, dict):
        return {_unhexed(k, info.key_type): _unhexed(v, info.value_type) for k, v in value.items()}
    if isinstance(info, msgspec.inspect.StructType) and isinstance(value, dict):
        fields = {f.encode_name: f.type for f in info.fields}
        return {k: _unhexed(v, fields[k]) if k in fields else v for k, v in value.items()}
    return value
