"""`kvstore bench vllm`: vLLM's own `LLM` on CPU, TTFT of a prompt whose 2k-token prefix is in kvstore
(host tier; NVMe only, after a daemon restart empties the host tier) against the same prompt recomputed,
and beside it vLLM's own ways to skip a prefill on CPU (its in-engine prefix cache; its
OffloadingConnector when it runs here). Needs the integration environment (scripts/integration_env.sh).

Each engine runs in a subprocess (bench.vllm_engine); TTFT is the wall time of a one-token generate.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Record, print_records, record
from kvstore.layout import KVLayout
from service.process import Daemon, write_config

ROOT = Path(__file__).resolve().parents[1]
PREFIX_TOKENS, SUFFIX_TOKENS, CHUNK, BLOCK = 2048, 32, 256, 32
MODEL = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64}


def run(quick: bool = False) -> list[Record]:
    num_prompts = 2 if quick else 4
    work = Path(tempfile.mkdtemp(prefix="kvbench-vllm-"))
    try:
        return _measure(work, num_prompts)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(work: Path, num_prompts: int) -> list[Record]:
    model = _write_model(work / "model")
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 1000) for _ in range(PREFIX_TOKENS + SUFFIX_TOKENS)] for _ in range(num_prompts + 1)]
    warm, measured = prompts[:1], prompts[1:]
    layout = KVLayout(num_layers=MODEL["num_hidden_layers"], num_kv_heads=MODEL["num_key_value_heads"],
                      head_dim=MODEL["head_dim"], dtype="float32", chunk_tokens=CHUNK)
    chunks = (num_prompts + 1) * (PREFIX_TOKENS // CHUNK + 1)
    config = write_config(_mkdir(work / "daemon"), layout=layout, host_chunks=chunks, nvme_chunks=chunks)
    daemon = Daemon(config, work / "daemon" / "daemon.log").start()
    base = {"model_dir": str(model), "block_size": BLOCK, "max_tokens": 1}
    kv = {"url": daemon.url, "chunk_tokens": CHUNK}
    try:
        recompute = _ttfts(base, None, warm + measured, work / "recompute")[1:]
        stored = _ttfts(base, kv, warm + measured, work / "store")[1:]
        host = _ttfts(base, kv, warm + measured, work / "host")[1:]
        daemon.stop()
        daemon.start()  # the host tier is memory: after a restart every chunk comes from NVMe
        nvme = _ttfts(base, kv, warm + measured, work / "nvme")[1:]
    finally:
        daemon.close()
    prefix = _ttfts({**base, "prefix_caching": True}, None, warm + measured + measured, work / "prefix")
    base_s = statistics.median(recompute)
    records = [_ttft("vllm.ttft.host", host, base_s), _ttft("vllm.ttft.nvme", nvme, base_s),
               _ttft("vllm.ttft.store", stored, base_s),
               _ttft("vllm.ttft.vllm_prefix_cache", prefix[1 + len(measured):], base_s)]
    records += _offload(base, warm + measured, work / "offload", base_s)
    print_records(f"kvstore bench vllm ({PREFIX_TOKENS}-token prefix + {SUFFIX_TOKENS} new tokens, "
                  f"{num_prompts} prompts, CPU)", records)
    return records


def _ttft(metric: str, values: list[float], recompute_s: float) -> Record:
    value = statistics.median(values)
    return record(metric, value, "s", "recomputed TTFT (no connector)", recompute_s, ratio=recompute_s / value)


def _offload(base: dict[str, Any], prompts: list[list[int]], work: Path, recompute_s: float) -> list[Record]:
    """vLLM's OffloadingConnector (CPU offload of the KV cache), same engine, each prompt twice."""
    try:
        values = _ttfts({**base, "offload": {"cpu_bytes_to_use": 1 << 30}}, None, prompts + prompts[1:], work)
    except RuntimeError as exc:
        print(f"vLLM OffloadingConnector does not run on this CPU platform: {str(exc).splitlines()[-1]}")
        return []
    return [_ttft("vllm.ttft.vllm_offloading_connector", values[len(prompts):], recompute_s)]


def _ttfts(base: dict[str, Any], connector: dict[str, Any] | None, prompts: list[list[int]], work: Path) -> list[float]:
    _mkdir(work)
    spec = {**base, "connector": connector, "steps": [{"generate": prompts}]}
    (work / "spec.json").write_text(json.dumps(spec))
    with (work / "vllm.log").open("wb") as log:
        code = subprocess.call([sys.executable, "-m", "bench.vllm_engine", str(work / "spec.json"),
                                str(work / "out.json")], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"vLLM run {work.name} failed ({code}):\n{(work / 'vllm.log').read_text()[-3000:]}")
    (results,) = json.loads((work / "out.json").read_text())["results"]
    return [r["ttft_s"] for r in results]


def _write_model(path: Path) -> Path:
    heads, dim = MODEL["num_attention_heads"], MODEL["head_dim"]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": heads * dim,
              "intermediate_size": 4 * heads * dim, "vocab_size": 1024, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", **MODEL}
    _mkdir(path).joinpath("config.json").write_text(json.dumps(config))
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
