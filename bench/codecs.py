"""Codec throughput and ratio: encode/decode GB/s per codec beside a memory copy, on realistic KV.

The KV comes from `bench.kv_synth` (key outlier channels + RoPE, token-scaled values; the note
there says why). Lossy codecs also report their measured max and mean error, relative to each
token-head vector's largest magnitude and to the mean |x|.
"""

from __future__ import annotations

import torch

from bench.common import best_time, gbps, print_records, record
from bench.kv_synth import synthetic_chunk
from kvstore.layout import KVLayout
from policies.compression import codec_names, make_codec


def _layout(quick: bool) -> KVLayout:
    # Llama-3-8B geometry (8 KV heads x 128, 256-token chunks) with fewer layers for a CPU run: 16 MiB / 4 MiB (quick)
    return KVLayout(num_layers=4 if quick else 16, num_kv_heads=8, head_dim=128, dtype="bfloat16", chunk_tokens=256)


def _errors(chunk: torch.Tensor, decoded: torch.Tensor, head_dim: int) -> tuple[float, float]:
    x = chunk.float().reshape(-1, head_dim)
    err = (decoded.float().reshape(-1, head_dim) - x).abs()
    amax = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    return float((err / amax).max()), float(err.mean() / x.abs().mean())


def run(quick: bool) -> list[dict]:
    layout = _layout(quick)
    repeats = 3 if quick else 7
    chunk = synthetic_chunk(layout, seed=1)
    raw = layout.chunk_bytes
    out = torch.empty_like(chunk)
    copy_s = best_time(lambda: out.copy_(chunk), repeats=repeats)
    copy_gbps = gbps(raw, copy_s)
    records = [record("memcpy", copy_gbps, "GB/s", "memcpy", copy_gbps)]
    for name in codec_names():
        codec = make_codec(name)
        payload = codec.encode(chunk, layout)
        encode_s = best_time(lambda codec=codec: codec.encode(chunk, layout), repeats=repeats)
        decode_s = best_time(lambda codec=codec, payload=payload: codec.decode_into(payload, out, layout), repeats=repeats)
        label = f"{name} encode" + (" (zero-copy view)" if name == "none" else "")
        records.append(record(label, gbps(raw, encode_s), "GB/s", "memcpy", copy_gbps))
        records.append(record(f"{name} decode", gbps(raw, decode_s), "GB/s", "memcpy", copy_gbps))
        records.append(record(f"{name} ratio", raw / payload.numel(), "x", "raw", 1.0))
        if not codec.lossless:
            codec.decode_into(payload, out, layout)
            max_rel, mean_rel = _errors(chunk, out, layout.head_dim)
            bound = 1 / 254 + 2**-8 if name == "int8" else 2**-4 + 2**-8
            records.append(record(f"{name} max err / vector amax", max_rel, "", "stated bound", bound))
            records.append(record(f"{name} mean err / mean |x|", mean_rel, "", "bf16 rounding", 2**-9))
    print_records(f"codecs on a {raw / 2**20:.0f} MiB bf16 chunk {layout.chunk_shape} (synthetic KV)", records)
    return records
