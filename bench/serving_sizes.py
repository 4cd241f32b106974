"""The sizes of `kvstore bench serving`: its workloads, the model each mode serves, and the KV pools and tiers.

vLLM's pool holds 1/POOL_SHARE of the sessions' KV (yet the longest request); kvstore's host tier holds all of it
twice over (host_chunks); `vllm_same_memory` gives vLLM's pool those host-tier bytes on top (same_memory_blocks).

Workloads (`--workload`): "mooncake" (sessions timed by the Mooncake trace) and "qa" (LMCache's multi-round QA:
12 users x 3 rounds (2 with --quick) at 0.5 requests/s (2), its 1,000-token shared system prompt, 2,000-token user
histories and 100-token answers scaled by ~1/5 to 192, 384 and 20 (16) tokens, 32-token questions). The full run's
sessions are sized for every run, both orders, in about 20 minutes on a quiet 2-core CPU with the
Llama-3.2-1B-shaped model.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.serving_model import LLAMA_1B, SMALL, ModelShape
from bench.serving_workload import Workload
from kvstore.errors import ConfigError

BLOCK, CHUNK, POOL_SHARE = 32, 256, 4  # the sessions' KV is POOL_SHARE x vLLM's pool
WORKLOADS = ("mooncake", "qa")
# (quick, workload) -> sessions: 12 each, so that the pool (1/POOL_SHARE of their KV) holds 2 of the longest prompts
# and vLLM runs several requests at once (it admits a request only when its whole prompt fits the free blocks).
# The full run's prompts are shorter than --quick's: its model's prefill costs ~15x the small one's per KV byte, and
# on this CPU one bf16 decode step of it costs about what 100 prompt tokens do (weights read from memory each step).
SESSIONS = {
    (True, "mooncake"): Workload(num_sessions=12, num_turns=2, system_tokens=256, context_tokens=384,
                                 message_tokens=32, answer_tokens=16),
    (False, "mooncake"): Workload(num_sessions=12, num_turns=2, system_tokens=192, context_tokens=256,
                                  message_tokens=32, answer_tokens=16),
    (True, "qa"): Workload(num_sessions=12, num_turns=2, system_tokens=192, context_tokens=384, message_tokens=32,
                           answer_tokens=16, qps=2.0),
    (False, "qa"): Workload(num_sessions=12, num_turns=3, system_tokens=192, context_tokens=384, message_tokens=32,
                            answer_tokens=20, qps=0.5),
}


def model_for(quick: bool) -> ModelShape:
    """--quick serves the small model; the full run the Llama-3.2-1B-shaped one, so prefill dominates."""
    return SMALL if quick else LLAMA_1B


def workload_for(quick: bool, workload: str) -> Workload:
    """Raises:
        ConfigError: an unknown workload name (the valid ones in the message).
    """
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown serving workload {workload!r}; use one of {', '.join(WORKLOADS)}")
    return SESSIONS[(quick, workload)]


@dataclass(frozen=True, slots=True)
class Pools:
    """KV capacity of one invocation: vLLM's pool (blocks of BLOCK tokens), kvstore's host tier (chunks of CHUNK
    tokens), and vLLM's pool with the host tier's bytes added (`vllm_same_memory`)."""

    num_blocks: int
    host_chunks: int
    same_memory_blocks: int
    max_model_len: int
    chunk_tokens: int = CHUNK


def pool_blocks(workload: Workload) -> int:
    """vLLM's KV pool in blocks: 1/POOL_SHARE of the sessions' KV, yet room for the longest request.

    Raises:
        ConfigError: the longest request would not fit such a pool (more sessions make the pool larger).
    """
    num_blocks = workload.total_kv_tokens // POOL_SHARE // BLOCK
    need = -(-workload.session_tokens // BLOCK) + 1  # vLLM keeps one block of its pool as a null block
    if num_blocks < need:
        raise ConfigError(f"a pool of 1/{POOL_SHARE} of the sessions' KV ({num_blocks} blocks) cannot hold one "
                          f"{workload.session_tokens}-token session ({need} blocks); add sessions or shorten them")
    return num_blocks


def pools(workload: Workload, extra_tokens: int = 0, chunk_tokens: int = CHUNK) -> Pools:
    """The pools for `workload`; `extra_tokens`: other KV the daemon must hold too (`vllm bench serve`'s prefixes).
    The host tier holds everything twice over (room for the daemon's own slack); vLLM's equal-memory pool adds
    exactly those host-tier bytes, at the same dtype, to its own pool. `chunk_tokens`: kvstore's chunk (a
    multiple of BLOCK)."""
    if chunk_tokens <= 0 or chunk_tokens % BLOCK:
        raise ConfigError(f"serving chunk of {chunk_tokens} tokens: use a positive multiple of vLLM's block, {BLOCK}")
    num_blocks = pool_blocks(workload)
    host_chunks = 2 * (workload.total_kv_tokens + extra_tokens) // chunk_tokens + 16
    return Pools(num_blocks=num_blocks, host_chunks=host_chunks,
                 same_memory_blocks=num_blocks + host_chunks * chunk_tokens // BLOCK,
                 max_model_len=(num_blocks - 1) * BLOCK,  # what the small pool holds (one block is vLLM's null block)
                 chunk_tokens=chunk_tokens)
