"""`Level`: one tier in the store with its policies, codec and background write queue."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from kvstore.chunk_format import aligned_empty
from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from kvstore.stats import Counters
from kvstore.types import ChunkMeta, TierKind
from policies.admission import AdmissionPolicy
from policies.compression import Codec, CompressionPolicy
from policies.compression.base import BufferEncoder
from policies.compression.streaming import StreamDecoder
from policies.eviction import AccessInfo, EvictionPolicy
from policies.tier_policy import make_policy
from tiers import Tier, make_tier
from tiers.byte_copy import copy_bytes
from tiers.disk_probe import probe_disk

logger = logging.getLogger(__name__)

CODEC_NONE = 0
MAX_ENCODERS = 8


@dataclass(eq=False)
class Level:
    """A tier in speed order (index 0 = fastest), the policies that govern it and its writers."""

    index: int
    config: TierConfig
    tier: Tier
    eviction: EvictionPolicy
    admission: AdmissionPolicy | None  # None: admit everything; may be the eviction policy itself
    compression: CompressionPolicy | None  # None: the fixed `config.codec` (or raw)
    queue: queue.Queue[bytes | None] | None = None
    threads: list[threading.Thread] = field(default_factory=list)
    _codecs: dict[tuple[str, int], Codec] = field(default_factory=dict)
    # Background writes encode chunks side by side, each on its writer's thread with a one-thread codec, at
    # most `encoders` at once: a chunk's pieces need no hand-over between threads, every core codes while
    # any chunk waits, and the writers beyond `encoders` write what is encoded without waiting for a slot.
    encoders: int = 1
    _encode_slots: threading.BoundedSemaphore = field(init=False)
    _overflow: dict[str, bool] = field(default_factory=dict)  # codec name -> raw when every encoder is busy
    stats: Counters | None = None  # the store's counters: `<tier>.stored_raw_encoders_busy`

    def __post_init__(self) -> None:
        if self.encoders < 1:
            raise ConfigError(f"tier {self.name}: a level needs at least one encoder, got {self.encoders}")
        self._encode_slots = threading.BoundedSemaphore(self.encoders)

    @property
    def kind(self) -> TierKind:
        return self.config.kind

    @property
    def name(self) -> str:
        return self.config.kind.value

    def admits(self, key: bytes, info: AccessInfo) -> bool:
        """Ask the admission policy; it first hears of the miss (ghost lists, second-hit counts)."""
        if self.admission is None:
            return True
        self.admission.on_miss(key, info)
        return bool(self.admission.admit(key, info))

    def codec(self, name: str, threads: int | None = None) -> Codec | None:
        """The codec `name` writes with (None for `none`), on `threads` threads (None: the tier's codec_threads)."""
        if name == "none":
            return None
        threads = self.config.codec_threads if threads is None else threads
        if (name, threads) not in self._codecs:
            from policies.compression import make_codec, writer_codec_name

            self._codecs[(name, threads)] = make_codec(writer_codec_name(name, self.name), threads=threads)
        return self._codecs[(name, threads)]

    def codec_for_write(self) -> Codec | None:
        name = self.config.codec
        if name == "auto":
            name = self.compression.codec_for(self.name) if self.compression is not None else "none"
        return self.codec(name)

    def encode(self, raw: torch.Tensor, layout: KVLayout, key: bytes, codec: Codec | None = None, *,
               background: bool = False) -> tuple[torch.Tensor, ChunkMeta]:
        """The payload this level stores for a raw chunk (1-D uint8), and its metadata.

        The payload may live in this thread's reusable buffer (`PayloadBuffers`): it is valid until the
        thread's next encode, so the caller hands it to `Tier.put` (which copies or writes it) first.
        A `background` write (a writer thread's) codes the chunk on its own thread, beside the other writers'
        chunks (at most `encoders` at once); on a tier with `raw_when_encoder_busy` it stores the chunk raw
        when every encoder is busy, rather than queueing behind them."""
        codec = self.codec_for_write() if codec is None else codec
        payload, codec_id = raw, CODEC_NONE
        if codec is not None:
            wait = not (background and self.raw_when_busy(codec.name))
            if self._encode_slots.acquire(blocking=wait):
                try:
                    coder = self.codec(codec.name, threads=1) if background else codec
                    assert coder is not None
                    payload, codec_id = self._encode_held(coder, raw, layout), int(codec.codec_id)
                finally:
                    self._encode_slots.release()
            elif self.stats is not None:  # every encoder busy: stored raw
                self.stats.incr(f"{self.name}.stored_raw_encoders_busy")
        meta = ChunkMeta(codec_id=codec_id, raw_bytes=raw.numel(), stored_bytes=payload.numel(),
                         layout_fingerprint=layout.fingerprint)
        return payload, meta

    def raw_when_busy(self, codec: str) -> bool:
        """Whether a background write through `codec` that finds every encoder busy stores its chunk raw: the
        config's true or false, or for "auto" whether always encoding would keep puts under 0.9 of the tier's
        raw write (the compression policy's speeds; without a policy the defaults `static` judges by)."""
        setting = self.config.raw_when_encoder_busy
        if isinstance(setting, bool):
            return setting
        if codec not in self._overflow:
            if self.compression is not None:
                keeps_pace = self.compression.put_keeps_pace(self.name, codec)
            else:
                keeps_pace = _default_keeps_pace(self.config, codec)
            self._overflow[codec] = not keeps_pace
            if not keeps_pace:
                logger.info("tier %s: codec %s encodes slower than 0.9 of the tier's write here, so a background "
                            "write that finds every encoder busy stores its chunk raw (raw_when_encoder_busy = "
                            "\"auto\"; set it to false to compress every chunk)", self.name, codec)
        return self._overflow[codec]

    @contextmanager
    def encoders_held(self, count: int | None = None) -> Iterator[None]:
        """Hold `count` encoder slots (None: all) for the `with` block, as encodes in flight would: background
        writes then wait for a free one, or go raw with `raw_when_encoder_busy` when none is left."""
        count = self.encoders if count is None else count
        for _ in range(count):
            self._encode_slots.acquire()
        try:
            yield
        finally:
            for _ in range(count):
                self._encode_slots.release()

    @staticmethod
    def _encode_held(codec: Codec, raw: torch.Tensor, layout: KVLayout) -> torch.Tensor:
        chunk = raw.view(layout.torch_dtype).view(layout.chunk_shape)
        if isinstance(codec, BufferEncoder):
            return codec.encode_into(chunk, layout, _PAYLOADS.get(codec.max_encoded_bytes(layout.chunk_bytes)))
        return codec.encode(chunk, layout)


def _default_keeps_pace(config: TierConfig, codec: str) -> bool:
    """`put_keeps_pace` by DEFAULT_PROFILES and the tier's bandwidth as `build_compression` reads it: how the
    static policy judges a store whose tiers all have a fixed codec."""
    from policies.compression.profiles import DEFAULT_PROFILES
    from policies.compression.speed_check import put_keeps_pace

    _, write = configured_bandwidth(config) or default_bandwidth(config)
    return put_keeps_pace(DEFAULT_PROFILES.get(codec), codec, write)


def default_bandwidth(config: TierConfig) -> tuple[float, float]:
    """The (read, write) bytes/s the compression policies assume for a tier of this kind."""
    from policies.compression.speed_check import DEFAULT_TIER_BANDWIDTH

    return DEFAULT_TIER_BANDWIDTH.get(config.kind.value, DEFAULT_TIER_BANDWIDTH["pfs"])


def configured_bandwidth(config: TierConfig, fallback: tuple[float, float] | None = None) -> tuple[float, float] | None:
    """(read, write) bytes/s the config gives a tier, or None when it gives neither. A write figure alone keeps
    the read of `fallback` (a probe's; else the kind's default); a read figure alone stands for the write too."""
    read, write = config.read_bytes_per_s, config.write_bytes_per_s
    if not read and not write:
        return None
    return read or (fallback or default_bandwidth(config))[0], write or read


def build_level(index: int, config: TierConfig, layout: KVLayout, compression: CompressionPolicy | None = None,
                stats: Counters | None = None) -> Level:
    options = dict(config.options)
    if config.path is not None:
        options.setdefault("path", config.path)
    if config.kind in (TierKind.NVME, TierKind.PFS):
        options.setdefault("num_workers", config.num_workers)
    tier = make_tier(config.kind, capacity_bytes=config.capacity_bytes, **options)
    capacity = max(1, config.capacity_bytes // tier.footprint(layout.chunk_bytes))
    name = config.eviction if config.admission == "always" else f"{config.eviction}+{config.admission}"
    policy = make_policy(name, capacity=capacity)  # as in `kvstore replay`
    level = Level(index=index, config=config, tier=tier, eviction=policy.eviction, admission=policy.admission,
                  compression=compression, encoders=encoders_for(config), stats=stats)
    level.codec_for_write()  # fail at start on an unknown codec name; its kernels load now, not in a put
    return level


def encoders_for(config: TierConfig) -> int:
    """How many chunks a tier's background writes encode at once: one per codec thread (codec_threads, 0 = every
    core), at most MAX_ENCODERS (each writer keeps a payload and a plane buffer, about 1.5 chunks)."""
    from policies.compression.blocks import default_threads

    return min(MAX_ENCODERS, config.codec_threads or default_threads())


def build_compression(config: StoreConfig) -> CompressionPolicy | None:
    """The store's compression policy, or None when every tier stores raw or a fixed codec."""
    from policies.compression.policy import LOSSY

    lossy = [t.kind.value for t in config.tiers if t.codec in LOSSY]
    if lossy and not config.allow_lossy:
        raise ConfigError(f"tiers {lossy} ask for a lossy codec; lossy codecs change the model's output and are "
                          "off by default: set allow_lossy = true to enable them")
    from policies.compression import make_compression_policy
    from policies.compression.policy import warn_fixed_codecs

    fixed = {t.kind.value: t.codec for t in config.tiers if t.codec != "auto"}
    overflow = {t.kind.value for t in config.tiers if t.raw_when_encoder_busy is not False}  # puts keep the disk's pace
    probed = probed_bandwidth(config) if config.compression == "measured" else {}
    bandwidth: dict[str, tuple[float, float]] = {}
    for t in config.tiers:  # a figure in the config wins over the probe, the probe over the kind's default
        figures = configured_bandwidth(t, probed.get(t.kind.value)) or probed.get(t.kind.value)
        if figures is not None:
            bandwidth[t.kind.value] = figures
    if config.compression == "static" and all(t.codec != "auto" for t in config.tiers):
        warn_fixed_codecs(fixed, bandwidth, config.allow_lossy, overflow)  # no policy: still say when a codec is slower than its tier
        return None
    options = {"layout": config.layout} if config.compression == "measured" else {}  # it calibrates on this layout
    return make_compression_policy(config.compression, tier_codecs=fixed, allow_lossy=config.allow_lossy,
                                   tier_bandwidth=bandwidth, overflow_tiers=overflow, **options)


def probed_bandwidth(config: StoreConfig) -> dict[str, tuple[float, float]]:
    """{tier kind: (read, write) bytes/s} of each disk tier's folder, probed (tiers/disk_probe.py; cached per
    folder), for the tiers whose config gives no read figure: the measured policy then weighs its codecs against
    this disk, not a default one."""
    speeds = {t.kind.value: probe_disk(t.path) for t in config.tiers
              if t.kind in (TierKind.NVME, TierKind.PFS) and t.path is not None and not t.read_bytes_per_s}
    return {kind: (s.read_bytes_per_s, s.write_bytes_per_s) for kind, s in speeds.items()}


def decode_into(meta: ChunkMeta, payload: torch.Tensor, out_bytes: torch.Tensor, layout: KVLayout) -> None:
    """Turn a stored payload back into raw chunk bytes in `out_bytes`."""
    if meta.codec_id == CODEC_NONE:
        copy_bytes(out_bytes[: payload.numel()], payload)
        return
    from policies.compression import codec_by_id

    out = out_bytes[: meta.raw_bytes].view(layout.torch_dtype).view(layout.chunk_shape)
    codec_by_id(meta.codec_id).decode_into(payload, out, layout)


def open_decoder(meta: ChunkMeta, payload: torch.Tensor, out_bytes: torch.Tensor, layout: KVLayout) -> StreamDecoder:
    """A decoder of the encoded payload about to land in `payload` into raw chunk bytes in `out_bytes`,
    fed as the payload arrives (policies/compression/streaming.py)."""
    from policies.compression import codec_by_id
    from policies.compression.stream_decoders import stream_decoder

    out = out_bytes[: meta.raw_bytes].view(layout.torch_dtype).view(layout.chunk_shape)
    return stream_decoder(codec_by_id(meta.codec_id), payload, out, layout)


class StagingBuffers(threading.local):
    """One reusable CPU buffer per thread, for reads that cannot land in the caller's memory, or for the
    payloads a thread encodes (`Level.encode`)."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def get(self, nbytes: int) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < nbytes:
            # 4 KiB-aligned: an O_DIRECT tier reads a compressed payload into it (or writes one from it)
            # in one call, in place
            self.buffer = aligned_empty(nbytes, pin_memory=torch.cuda.is_available())
        return self.buffer[:nbytes]


_PAYLOADS = StagingBuffers()  # encoded payloads, per thread, reused chunk after chunk
