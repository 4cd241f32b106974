"""How an engine plugin (vLLM, LMCache, SGLang) reaches kvstore: the sidecar daemon or an embedded store.

Plugins get their settings as a flat string map from the engine's own config (vLLM's
kv_connector_extra_config, LMCache's extra_config, SGLang's storage extra config). `StoreOptions`
parses and validates that map once (the deadline options are `Deadlines`', connector/deadlines.py);
`open_store` opens the `EngineStore` (connector/engine_store.py) for the layout the engine computes with:
a daemon gets it registered (POST /v1/layouts; one with no layout in its config serves every model that
registers), an embedded store from a config that names no layout takes it as its own; a store fixed to
another layout fails at start-up with both layouts in the message rather than serving KV of the wrong shape.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from connector.deadlines import Deadlines
from connector.engine_store import EngineStore
from kvstore.errors import ConfigError, LayoutMismatchError
from kvstore.flags import parse_bool
from kvstore.layout import KVLayout

logger = logging.getLogger(__name__)

_FIELDS = {"url", "token", "use_shm", "config", "root_dir", "model_id"} | Deadlines.names()


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreOptions:
    """Where the store is. `url` set: the `kvstore serve` daemon there; else an embedded TieredStore
    from the kvstore config file `config` (or the default host + NVMe tiers under `root_dir`).
    `model_id` names the weights explicitly in the chunks' scope (kvstore.kv_scope; default: the model's
    name or path as the engine loaded it); the deadline options are `Deadlines`'."""

    url: str | None = None
    token: str | None = None
    use_shm: bool | None = None
    config: str | None = None
    root_dir: str | None = None
    model_id: str | None = None
    deadlines: Deadlines = field(default_factory=Deadlines)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "", ignore: Sequence[str] = ()) -> StoreOptions:
        """Read `prefix + field` keys of an engine's extra-config map; other keys under `prefix` raise
        unless named in `ignore` (the engine's own keys that share the map)."""
        picked = {k[len(prefix):]: v for k, v in data.items() if k.startswith(prefix)}
        unknown = sorted(set(picked) - _FIELDS - set(ignore))
        if unknown:
            raise ConfigError(f"unknown kvstore option(s) {[prefix + k for k in unknown]}; "
                              f"valid: {sorted(prefix + f for f in _FIELDS)}")
        fields = {k: v for k, v in picked.items() if k in _FIELDS - Deadlines.names()}
        if "use_shm" in fields:
            fields["use_shm"] = parse_bool(fields["use_shm"], field=prefix + "use_shm")
        return cls(**fields, deadlines=Deadlines.from_mapping(picked))


def open_store(options: StoreOptions, layout: KVLayout, name: str = "engine", *, model: str | None = None) -> EngineStore:
    """Open the store for an engine computing with `layout`, its calls within the options' deadlines and
    named `name` in logs; raises ConfigError/LayoutMismatchError (and the client's errors when the daemon
    cannot be reached) with the fix in the message. `model` (the model's name or id) is sent to a daemon
    with every request, for its per-model hit counts."""
    store: EngineStore
    if options.url:
        from connector.client import KVStoreClient

        store = KVStoreClient(options.url, token=options.token, use_shm=options.use_shm, model=model, layout=layout,
                              deadlines=options.deadlines, name=name)
        where = f"the kvstore daemon at {options.url}"
    else:
        from connector.embedded_store import EmbeddedStore
        from kvstore.config import StoreConfig, load_config
        from kvstore.store import TieredStore

        if options.config:
            config = load_config(options.config)
            if config.any_layout:  # the config names no layout: this engine's is the store's
                config = dataclasses.replace(config, layout=layout)
        else:
            config = StoreConfig.embedded(layout=layout, root_dir=options.root_dir, model_id=options.model_id or "default")
        store = EmbeddedStore(TieredStore(config), options.deadlines, name)
        where = f"the embedded store ({options.config or 'default tiers'})"
    if store.layout != layout:
        store.close()
        raise LayoutMismatchError(
            f"{where} stores {store.layout}, but the engine computes {layout}; start the store with the "
            f"engine's layout (e.g. `kvstore serve` with [layout] num_layers={layout.num_layers} "
            f"num_kv_heads={layout.num_kv_heads} head_dim={layout.head_dim} dtype={layout.dtype!r} "
            f"chunk_tokens={layout.chunk_tokens})")
    logger.info("kvstore: engine plugin on %s (%s)", where, layout)
    return store


def load_buffer(store: EngineStore) -> torch.Tensor:
    """A chunk buffer to get into: `store.empty_chunk()`. From a daemon with shared-memory segments it
    lives in the client's pool, so the daemon copies a hit straight into it (one copy); a buffer of the
    engine's own memory would take two (the daemon cannot write into another process's private memory,
    so it fills a staging slot and the client copies). Made outside torch.inference_mode, which engines
    call their connectors under: the store's reader threads may not write into an inference tensor."""
    with torch.inference_mode(False):
        return store.empty_chunk()


def owned_buffer(store: EngineStore, chunk: torch.Tensor) -> torch.Tensor:
    """`chunk` (a view into the engine's memory, canonical shape) copied once into a `load_buffer`, which the
    daemon then reads from its shared slot: a queued save reads it later, after the engine has reused its own."""
    buffer = load_buffer(store)
    buffer.copy_(chunk)
    return buffer
