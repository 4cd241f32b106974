"""`ModelRunner`: owns the model and its paged KV cache, turns a scheduled batch into one forward pass."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from connector.engine.attention import AttentionBatch, Workspace
from connector.engine.model import LlamaModel, ModelConfig
from connector.engine.sequence import Sequence

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepInput:
    """What a sequence feeds this step: tokens [start, start + num_tokens)."""

    seq: Sequence
    start: int
    num_tokens: int


class ModelRunner:
    """KV cache layout, one tensor for all layers (a layer's slice maps onto the store's chunk)::

        kv_cache[layer, plane (0=K, 1=V), block, token in page, kv_head, dim]
    """

    def __init__(self, config: ModelConfig, num_blocks: int, page_size: int, device: str = "cpu") -> None:
        self.config = config
        self.page_size = page_size
        self.device = torch.device(device)
        self.model = LlamaModel(config).to(self.device)
        self.kv_cache = torch.zeros(config.num_layers, 2, num_blocks, page_size, config.num_kv_heads,
                                    config.head_dim, dtype=getattr(torch, config.dtype), device=self.device)
        self.workspace = Workspace(self.kv_cache.dtype, self.device)  # grows to the largest step's gathered K/V
        logger.info("model runner: %d layers, %d pages x %d tokens, KV cache %.1f MiB", config.num_layers,
                    num_blocks, page_size, self.kv_cache.numel() * self.kv_cache.element_size() / 2**20)

    def execute(self, inputs: list[StepInput]) -> torch.Tensor:
        """Run the batch; returns logits [len(inputs), vocab] at each input's last fed token."""
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last: list[int] = []
        for item in inputs:
            ids = item.seq.token_ids[item.start : item.start + item.num_tokens]
            pos = list(range(item.start, item.start + item.num_tokens))
            token_ids.extend(ids)
            positions.extend(pos)
            blocks = item.seq.block_ids
            slots.extend(blocks[p // self.page_size] * self.page_size + p % self.page_size for p in pos)
            last.append(len(token_ids) - 1)
        max_pages = max(len(item.seq.block_ids) for item in inputs)
        tables = torch.zeros(len(inputs), max_pages, dtype=torch.long)
        for i, item in enumerate(inputs):
            tables[i, : len(item.seq.block_ids)] = torch.tensor(item.seq.block_ids)
        batch = AttentionBatch(
            positions=torch.tensor(positions, device=self.device),
            slot_ids=torch.tensor(slots, device=self.device),
            seq_lens=[item.num_tokens for item in inputs],
            context_lens=[item.start + item.num_tokens for item in inputs],
            block_tables=tables.to(self.device),
            workspace=self.workspace,
        )
        tokens = torch.tensor(token_ids, device=self.device)
        return self.model(tokens, batch, self.kv_cache, torch.tensor(last, device=self.device))
