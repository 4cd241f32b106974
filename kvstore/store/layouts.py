"""`LayoutSet`: the KV layouts a store serves: the config's one, or every layout its clients register.

    fixed (a config that names a layout)    {config.layout}; registering another is a LayoutMismatchError
    open  (`any_layout`: no layout named)   {config.layout} (the default preset, for clients that register
                                            none) plus each client's layout, added as it registers

An open set keeps the registered layouts in `layouts.json` beside the first disk tier's chunks (rewritten
atomically on each new layout, read at start), so a restarted store serves every layout's recovered chunks
(their headers name the fingerprint; this file, the shape) before any client registers again.

A chunk tensor's shape and dtype name its layout exactly ([layers, planes, tokens, heads, head_dim]:
planes is 2 for K/V, 1 for an MLA latent), so a put or get needs no layout argument: the store finds
the registered layout its buffer has, and a stored chunk is read only into a buffer of the layout its
header names (`ChunkMeta.layout_fingerprint`); any other read is a miss.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

from kvstore.errors import ConfigError, LayoutMismatchError
from kvstore.layout import KVLayout

logger = logging.getLogger(__name__)
LAYOUTS_FILE = "layouts.json"
MAX_LAYOUTS = 64  # a node serves a handful of models; the cap bounds what registrations can grow
ShapeKey = tuple[tuple[int, ...], torch.dtype]


class LayoutSet:
    """Registered layouts by fingerprint and by chunk shape. Thread-safe (registration is rare; reads
    of the two dicts need no lock)."""

    def __init__(self, default: KVLayout, *, fixed: bool, folder: str | None = None) -> None:
        """`folder`: where an open set keeps its layouts across restarts (None: in memory only)."""
        self.default = default
        self.fixed = default if fixed else None
        self._by_fingerprint: dict[int, KVLayout] = {}
        self._by_shape: dict[ShapeKey, KVLayout] = {}
        self._lock = threading.Lock()
        self._file = Path(folder) / LAYOUTS_FILE if folder is not None and not fixed else None
        self._add(default)
        for layout in self._read():
            self._add(layout)

    @property
    def is_open(self) -> bool:
        """Whether clients' layouts are added as they register (no fixed layout)."""
        return self.fixed is None

    def register(self, layout: KVLayout) -> KVLayout:
        """Serve `layout` from now on; a fixed set accepts only its own.

        Raises:
            LayoutMismatchError: the set is fixed to another layout (the message names both), or holds
                MAX_LAYOUTS layouts already.
        """
        if self.fixed is not None:
            if layout != self.fixed:
                raise LayoutMismatchError(
                    f"this store serves one layout, {_describe(self.fixed)}; the client computes "
                    f"{_describe(layout)}. Start the store with the client's layout, or with no [layout] "
                    "(any_layout) so that it serves every model that registers")
            return layout
        with self._lock:
            if layout.fingerprint not in self._by_fingerprint:
                if len(self._by_fingerprint) >= MAX_LAYOUTS:
                    raise LayoutMismatchError(f"this store serves {MAX_LAYOUTS} layouts, the most it keeps; serve "
                                              "further models from another store")
                self._add(layout)
                self._write()
        return layout

    def _add(self, layout: KVLayout) -> None:
        self._by_fingerprint[layout.fingerprint] = layout
        self._by_shape[(layout.chunk_shape, layout.torch_dtype)] = layout

    def _read(self) -> list[KVLayout]:
        if self._file is None or not self._file.exists():
            return []
        try:
            return [KVLayout.from_dict(item) for item in json.loads(self._file.read_text())]
        except (OSError, ValueError, TypeError, ConfigError) as exc:  # its chunks then wait for their models
            logger.warning("%s unreadable (%s): recovered chunks are served once their models register", self._file, exc)
            return []

    def _write(self) -> None:
        """Every layout to the file, atomically (temp file, fsync, rename); a failure only costs a restart's
        early hits."""
        if self._file is None:
            return
        temp = self._file.with_suffix(".tmp")
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            with temp.open("w") as out:
                json.dump([layout.to_dict() for layout in self._by_fingerprint.values()], out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self._file)
        except OSError as exc:
            logger.warning("%s not written (%s): after a restart these layouts' chunks wait for their models to "
                           "register again", self._file, exc)

    def by_fingerprint(self, fingerprint: int) -> KVLayout | None:
        return self._by_fingerprint.get(fingerprint)

    def of_chunk(self, chunk: torch.Tensor) -> KVLayout:
        """The registered layout whose chunk shape and dtype `chunk` has.

        Raises:
            LayoutMismatchError: no registered layout has that shape and dtype.
        """
        layout = self._by_shape.get((tuple(chunk.shape), chunk.dtype))
        if layout is None:
            served = " or ".join(f"{lay.chunk_shape} {lay.torch_dtype}" for lay in self)
            raise LayoutMismatchError(
                f"chunk has shape {tuple(chunk.shape)} dtype {chunk.dtype}; this store needs {served} ([layers, "
                "planes, chunk_tokens, kv_heads, head_dim]); a store with no [layout] serves others once registered")
        return layout

    def __iter__(self) -> Iterator[KVLayout]:
        return iter(list(self._by_fingerprint.values()))

    def __len__(self) -> int:
        return len(self._by_fingerprint)


def _describe(layout: KVLayout) -> str:
    """The layout as its [layout] table's fields (what to start a store with)."""
    return (f"[layout] num_layers={layout.num_layers} num_kv_heads={layout.num_kv_heads} head_dim={layout.head_dim} "
            f"dtype={layout.dtype!r} chunk_tokens={layout.chunk_tokens} kind={layout.kind.value!r}")
