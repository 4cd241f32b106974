"""`ModelLayouts`: the layouts clients registered (POST /v1/layouts), and the layout each request names.

    register(tenant, model, layout)   the store serves `layout` from now on (TieredStore.register_layout);
                                      a model name keeps one per-token geometry per tenant (KV heads, head
                                      size, dtype, chunk tokens, kind), so its per-model hit counts and budget
                                      are of one shape: another geometry under it is refused. The layer count
                                      may differ: each pipeline-parallel stage registers its own layers
    resolve(fingerprint)              a request's `layout` field -> KVLayout (absent: the default layout)

Chunk keys already differ per layout (the fingerprint is folded into every key's root, kvstore/kv_scope.py),
so two models never share a chunk; the store reads a chunk only into a buffer of the layout its header
names. A daemon whose config names a layout serves that one only (registering another is refused with both
layouts in the message); one with no layout in its config (`any_layout`) serves every registered layout
from one set of tiers.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from kvstore.errors import LayoutMismatchError, UnregisteredLayoutError
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from service.errors import BadRequestError

logger = logging.getLogger(__name__)
MAX_MODELS = 256  # registered (tenant, model) names: each holds a few hundred bytes, for the daemon's life


class ModelLayouts:
    """Registrations by (tenant, model name), and every layout the store serves by fingerprint."""

    def __init__(self, store: TieredStore) -> None:
        self.store = store
        self._by_model: dict[tuple[str, str], KVLayout] = {}
        self._lock = threading.Lock()

    def register(self, tenant: str, model: str, layout: KVLayout) -> KVLayout:
        """Serve `layout` for `model` ("" for a client that names none: nothing to keep apart).

        Raises:
            LayoutMismatchError: the model registered another layout before, or the daemon's config fixes
                another layout.
            BadRequestError: MAX_MODELS names are registered already.
        """
        with self._lock:
            before = self._by_model.get((tenant, model)) if model else None
            if before is not None and dataclasses.replace(before, num_layers=layout.num_layers) != layout:
                raise LayoutMismatchError(
                    f"model {model!r} registered layout {_describe(before)} before; this client computes "
                    f"{_describe(layout)}. One model name keeps one KV geometry (its hit counts and budget; only "
                    "the layer count of a pipeline stage may differ): name the other one apart (the kvstore "
                    "model_id option), or restart the daemon to drop the old one")
            if model and before is None and len(self._by_model) >= MAX_MODELS:
                raise BadRequestError(f"{MAX_MODELS} models are registered on this daemon, the most it keeps; "
                                      "register fewer model names (model_id) or restart the daemon")
            self.store.register_layout(layout)
            if model and before is None:
                self._by_model[(tenant, model)] = layout
                logger.info("tenant %s: model %r registered, %s", tenant, model, _describe(layout))
        return layout

    def resolve(self, fingerprint: str | None) -> KVLayout:
        """The layout a request names by fingerprint (16 hex digits); None: the daemon's default layout.

        Raises:
            LayoutMismatchError: `fingerprint` is not 16 hex digits.
            UnregisteredLayoutError: no layout of that fingerprint is registered (the fix: register first).
        """
        if fingerprint is None:
            return self.store.layout
        try:
            value = int(fingerprint.lower().removeprefix("0x"), 16)
        except ValueError:
            raise LayoutMismatchError(f"layout {fingerprint[:40]!r} is not a fingerprint (16 hex digits)") from None
        layout = self.store.layouts.by_fingerprint(value)
        if layout is None:
            raise UnregisteredLayoutError(
                f"layout {fingerprint[:40]!r} is not served here: register it first (POST /v1/layouts, which "
                "KVStoreClient(layout=...) does; a restarted daemon needs the registration again)")
        return layout


def _describe(layout: KVLayout) -> str:
    return (f"[{layout.kind.value} num_layers={layout.num_layers} num_kv_heads={layout.num_kv_heads} "
            f"head_dim={layout.head_dim} dtype={layout.dtype} chunk_tokens={layout.chunk_tokens}]")
