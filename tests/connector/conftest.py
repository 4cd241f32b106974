"""Tiny engine factories: a small Llama config, its transformers twin, and engines with or without a store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from connector.engine.llm_engine import EngineConfig, LLMEngine
from connector.engine.model import ModelConfig
from connector.engine.scheduler import SchedulerConfig
from kvstore.config import StoreConfig
from kvstore.store import TieredStore

MODEL = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, seed=1)
PAGE = 4
CHUNK = 16


def engine_config(**scheduler: object) -> EngineConfig:
    options = {"max_num_batched_tokens": 64, "max_num_seqs": 8, **scheduler}
    return EngineConfig(model=MODEL, scheduler=SchedulerConfig(**options), page_size=PAGE, num_blocks=128,  # type: ignore[arg-type]
                        record_logits=True)


def make_store(tmp_path: Path, *, host_chunks: int = 64, nvme_chunks: int = 256) -> TieredStore:
    layout = MODEL.kv_layout(CHUNK)
    cfg = StoreConfig.embedded(layout=layout, model_id="engine-test", root_dir=tmp_path,
                               host_bytes=host_chunks * layout.chunk_bytes,
                               nvme_bytes=nvme_chunks * (layout.chunk_bytes + 8192))
    return TieredStore(cfg)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[Any]:
    """Tiny matmuls on a shared 2-core box: one intra-op thread avoids spin-wait contention (10x faster)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    with make_store(tmp_path) as s:
        yield s


def prompt(seed: int, length: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, MODEL.vocab_size, (length,), generator=gen).tolist()


def hf_model(engine: LLMEngine) -> Any:
    """transformers' LlamaForCausalLM with the engine's config and weights (fp32, eager attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**MODEL.to_hf_dict())  # type: ignore[arg-type]
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(engine.runner.model.state_dict(), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model


def hf_logits(model: Any, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()
