"""The proxy's settings, validated at start: instances, limits, timeouts, auth, optional kvstore routing."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from kvstore.errors import ConfigError


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One upstream OpenAI server (a `vllm serve`) and the kvstore cluster node it sits on, if any."""

    url: str
    node_id: str | None = None

    @classmethod
    def parse(cls, text: str, *, option: str) -> InstanceSpec:
        """`URL` or `NODE_ID=URL` (the node id of the kvstore daemon next to it, for cluster routing).

        Raises:
            ConfigError: not an http(s) URL with a host and port (the option and the text in the message).
        """
        node_id, sep, url = text.partition("=")
        if not sep or "://" in node_id:
            node_id, url = "", text
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(f"{option} {text!r} is not an instance URL; give http://HOST:PORT "
                              f"or NODE_ID=http://HOST:PORT (no path: the proxy adds /v1/...)")
        return cls(url=url.rstrip("/"), node_id=node_id or None)


@dataclass(frozen=True, slots=True)
class EventSource:
    """A node's daemon event endpoints: `NODE_ID=tcp://HOST:PORT,tcp://HOST:REPLAY_PORT` on the command line."""

    node_id: str
    endpoint: str
    replay_endpoint: str
    topic: str = "kv-events"

    @classmethod
    def parse(cls, text: str, *, option: str = "--kv-events") -> EventSource:
        node_id, _, rest = text.partition("=")
        endpoint, _, replay = rest.partition(",")
        if not node_id or not all(e.startswith(("tcp://", "ipc://")) for e in (endpoint, replay)):
            raise ConfigError(f"{option} {text!r}: give NODE_ID=tcp://HOST:PORT,tcp://HOST:REPLAY_PORT (the daemon's "
                              "service.kv_events endpoint and replay_endpoint)")
        return cls(node_id, endpoint, replay)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    """What `kvstore pd-proxy` runs with. Times in seconds, sizes in bytes.

    `max_in_flight` client requests at once (429 beyond); `max_body_bytes` per request body (413 beyond);
    every upstream call has `connect_timeout_s` and its own read timeout (a streamed decode: between two
    pieces); `health_interval_s` between two polls of an instance's /health, each `health_timeout_s` at most.
    A prompt given as token ids and shorter than `local_prefill_tokens` goes straight to a decode instance,
    which computes it (cheap for a short prompt; the prefill hop adds a round trip and a queue to its TTFT).
    """

    prefill: tuple[InstanceSpec, ...]
    decode: tuple[InstanceSpec, ...]
    api_key: str | None = None
    max_in_flight: int = 256
    max_body_bytes: int = 16 << 20
    connect_timeout_s: float = 5.0
    prefill_timeout_s: float = 300.0
    decode_timeout_s: float = 600.0
    health_interval_s: float = 3.0
    health_timeout_s: float = 2.0
    kvstore_url: str | None = None
    kvstore_token: str | None = None
    route_timeout_s: float = 1.0
    max_load_gap: int = 2  # a routed instance is taken while its in-flight count is within this of the least
    local_prefill_tokens: int = 0  # a token-id prompt shorter than this skips the prefill hop (0: none does)
    kv_events: tuple[EventSource, ...] = ()  # route from the nodes' KV events (event_index.py) instead of /v1/route

    def __post_init__(self) -> None:
        if not self.decode:
            raise ConfigError("no decode instance: give at least one --decode http://HOST:PORT")
        for name in ("max_in_flight", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("connect_timeout_s", "prefill_timeout_s", "decode_timeout_s", "health_interval_s",
                     "health_timeout_s", "route_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        for name in ("max_load_gap", "local_prefill_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        urls = [s.url for s in (*self.prefill, *self.decode)]
        if len(set(urls)) != len(urls):
            raise ConfigError(f"an instance is given twice among {urls}; each URL once, as --prefill or --decode")
        if self.kv_events:
            _check_pyzmq()
        if self.kv_events and self.kvstore_url is None:
            raise ConfigError("--kv-events needs --kvstore-url: a daemon whose /v1/info gives the key namespace "
                              "(root key, chunk size) the proxy hashes prompts with")
        if self.kvstore_url is not None and urlsplit(self.kvstore_url).scheme not in ("http", "https"):
            raise ConfigError(f"--kvstore-url {self.kvstore_url!r} is not an http(s) URL of a kvstore daemon")


def _check_pyzmq() -> None:
    try:
        import zmq  # noqa: F401  (the optional `events` extra)
    except ImportError:
        raise ConfigError("--kv-events needs pyzmq, which is not installed: pip install 'kvstore[events]' "
                          "(or pyzmq>=26), or route with the cluster's /v1/route instead") from None
