"""`KVStoreConnector`: vLLM's KV connector (v1 API) on kvstore. Imports vllm; nothing in kvstore imports it.

    from vllm.config import KVTransferConfig
    KVTransferConfig(kv_connector="KVStoreConnector", kv_connector_module_path="connector.vllm.vllm_connector",
                     kv_role="kv_both", kv_load_failure_policy="recompute",
                     kv_connector_extra_config={"url": "http://127.0.0.1:8765", "chunk_tokens": 256})

Without "url" the connector opens an embedded TieredStore ("config": a kvstore TOML, or "root_dir"
for the default host + NVMe tiers), shared by the scheduler and worker halves of one process; when vLLM
runs its worker in another process (`vllm serve`'s default layout) that is refused: use a daemon.
The chunk layout comes from vLLM's model config (layers, KV heads, head size, KV dtype) and
"chunk_tokens" (a multiple of the block size) and is registered with the daemon, which serves it beside
other models' layouts (no [layout] in its config) or refuses it at start (another [layout]). An MLA model
(DeepSeek-V2/V3, Kimi...) is stored as one latent per token and layer (AttentionKind.MLA): every
tensor-parallel rank holds the same latent, so its keys name no TP size, rank 0 saves and the other ranks
load (kvstore.kv_scope.shard_role); MLA settings that pack or split the latent are refused at start
(connector.vllm.mla).
Chunk keys are scoped (kvstore.kv_scope) by the model (its name or path and revision, or "model_id"),
KV dtype, layout and parallel shape, each request's LoRA adapter and its `cache_salt`. Every store call
has a deadline ("lookup_timeout_s", "load_timeout_s", "save_timeout_s"; connector/deadlines.py).
Loads are asynchronous ("async_load": true, the default): the request waits in vLLM's WAITING_FOR_REMOTE_KVS
while a loader thread fills its blocks and the other requests keep decoding. "async_load": false runs every
load in the step; "auto" picks per load (connector.vllm.load_pacing: in the step when that costs the running
requests less than the steps the loading request would wait). A step's end waits a moment for the background
loads it started ("load_finish_wait", default true; connector.vllm.finish_wait), so a load done in milliseconds
lets its request run in the next step instead of the one after. The chunks the model's answer
fills are saved when the request finishes ("save_decode", default true), so a conversation's next turn hits
its whole history. kv_role "kv_producer" saves and never loads, "kv_consumer" loads and never saves; a
producer's answer names the chunks it saved (its prompt's partial last chunk too: "save_partial_chunk",
default true for a producer), and a consumer handed them waits up to "handoff_wait_s" for those still in
flight (connector.vllm.handoff). The connector's figures reach vLLM's log line and /metrics (connector.vllm.stats).
It implements SupportsHMA: vLLM keeps its hybrid KV cache manager, and a model with several KV cache groups
(sliding window or Mamba / linear attention beside full attention) has each group looked up, saved and loaded on
its own (connector.vllm.hybrid, connector.vllm.window); a state group keeps its state at each chunk boundary
(connector.vllm.state; prefix caching on and chunk_tokens = vLLM's block size: connector.vllm.groups).
Scheduler side: connector.vllm.plan; worker side: connector.vllm.transfer and connector.vllm.async_loads;
page copies: connector.vllm.paged (CUDA kernels from gpu_kernels for the K/V-first layout).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank
from vllm.model_executor.models.utils import extract_layer_index
from vllm.platforms import current_platform

from connector.engine_store import EngineStore
from connector.plugin_store import StoreOptions, open_store
from connector.vllm.async_loads import AsyncLoads
from connector.vllm.finish_wait import FinishWait
from connector.vllm.groups import group_layer_names, hybrid_groups
from connector.vllm.handoff import Handoff, handoff_wait_option
from connector.vllm.hybrid import GroupTransfer, HybridTransfer, Tables, hybrid_lookup, planning_group
from connector.vllm.kv_events import SavedBlockEvents
from connector.vllm.load_pacing import LoadPacing, in_background, load_mode
from connector.vllm.mla import check_mla, cpu_rope_warning
from connector.vllm.paged import detect_kind, detect_latent
from connector.vllm.plan import ChunkPlanner, ScheduledRequest, StepPlan, TransferSpec
from connector.vllm.scope import identity_from_vllm, request_scope
from connector.vllm.state import StateTransfer
from connector.vllm.stats import KVStoreConnectorStats, KVStorePromMetrics
from connector.vllm.transfer import PagedTransfer
from connector.vllm.vllm_types import VllmConnectorOutput, VllmRequest, VllmSchedulerOutput
from connector.vllm.window import GroupKind
from kvstore.errors import ConfigError
from kvstore.flags import parse_bool
from kvstore.hashing import ChunkHasher
from kvstore.kv_scope import shard_role
from kvstore.layout import AttentionKind, KVLayout

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)
_STORES: dict[tuple[StoreOptions, KVLayout], tuple[EngineStore, int]] = {}
_ONE_PROCESS_BACKENDS = ("uni", "external_launcher")
_OWN_KEYS = ("chunk_tokens", "async_load", "save_decode", "handoff_wait_s", "save_partial_chunk", "load_finish_wait",
             "kv_events_medium")
_STORE_COUNTERS = {"load_timeouts": "load_timeouts", "save_timeouts": "save_timeouts", "failures": "store_failures",
                   "breaker_opened": "breaker_opened", "dropped_save_chunks": "dropped_save_chunks"}
_STORES_LOCK = threading.Lock()
IDLE_WAIT_S = 0.01  # a step that scheduled no token waits at most this long for a background load to end


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    """One step's loads and saves, from the scheduler half to the worker half."""

    plan: StepPlan = field(default_factory=StepPlan)
    tables: dict[str, Tables] = field(default_factory=dict)  # per-group block ids (hybrid models), per request


def layout_from_vllm(vllm_config: VllmConfig, chunk_tokens: int) -> KVLayout:
    """kvstore's chunk layout for the model vLLM runs (per tensor-parallel rank); for MLA one latent of
    kv_lora_rank + rope dims per token (vLLM's head size), after refusing what packs or splits it."""
    model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    dtype = model.dtype if cache.cache_dtype == "auto" else cache.cache_dtype
    if model.use_mla:
        check_mla(model=str(model.model), cache_dtype=str(cache.cache_dtype),
                  dcp_size=parallel.decode_context_parallel_size, pcp_size=parallel.prefill_context_parallel_size,
                  hf_config=model.hf_text_config.to_dict())
        return KVLayout(num_layers=model.get_num_layers(parallel), num_kv_heads=1, head_dim=model.get_head_size(),
                        dtype=str(dtype).removeprefix("torch."), chunk_tokens=chunk_tokens, kind=AttentionKind.MLA)
    return KVLayout(num_layers=model.get_num_layers(parallel), num_kv_heads=model.get_num_kv_heads(parallel),
                    head_dim=model.get_head_size(), dtype=str(dtype).removeprefix("torch."), chunk_tokens=chunk_tokens)


def cpu_attn_isa(dtype: torch.dtype, block_size: int, head_size: int, cache_dtype: str = "auto") -> str | None:
    """The ISA vLLM's CPU attention backend picks for this model on this machine (it decides the cache's
    layout: connector.vllm.paged), as vLLM picks it; None off the CPU backend."""
    if not current_platform.is_cpu():
        return None
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError as exc:  # a vLLM that moved it: its chunks keep vLLM's bytes, named by "unknown"
        logger.warning("kvstore connector: cannot tell vLLM's CPU attention ISA (%s); chunks are kept in vLLM's own "
                       "CPU layout and shared only with servers that cannot tell it either", exc)
        return "unknown"
    return str(_get_attn_isa(dtype, block_size, head_size, cache_dtype))


def _acquire_store(options: StoreOptions, layout: KVLayout, model: str) -> EngineStore:
    """One store per process and settings, shared by the connector halves that run in this process."""
    with _STORES_LOCK:
        store, users = _STORES.get((options, layout), (None, 0))
        if store is None:
            store = open_store(options, layout, "vllm-connector", model=model)
        _STORES[(options, layout)] = (store, users + 1)
        return store


def _release_store(options: StoreOptions, layout: KVLayout) -> None:
    with _STORES_LOCK:
        store, users = _STORES.pop((options, layout), (None, 0))
        if store is not None and users > 1:
            _STORES[(options, layout)] = (store, users - 1)
        elif store is not None:
            store.close()


class KVStoreConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector: prefix chunks from kvstore instead of prefill, computed chunks into kvstore."""

    # kv_cache_config: vLLM's KVCacheConfig (vllm.v1.kv_cache_interface), handed to the base class as it came
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        if self._kv_transfer_config.kv_load_failure_policy != "recompute":
            raise ConfigError("kvstore treats a chunk it cannot load as a miss for vLLM to recompute: "
                              "set KVTransferConfig(kv_load_failure_policy='recompute')")
        self._block_size = vllm_config.cache_config.block_size
        self.layout = layout_from_vllm(vllm_config, int(extra.get("chunk_tokens", 256)))
        self._options = StoreOptions.from_mapping(extra, ignore=_OWN_KEYS)
        _refuse_split_embedded(self._options, vllm_config)
        model = vllm_config.model_config
        self._cpu_isa = None if self.layout.kind is AttentionKind.MLA else cpu_attn_isa(  # MLA: the same rows on every backend
            model.dtype, self._block_size, model.get_head_size(), vllm_config.cache_config.cache_dtype)
        self._tp_size = vllm_config.parallel_config.tensor_parallel_size
        if self.layout.kind is AttentionKind.MLA and current_platform.is_cpu():
            warning = cpu_rope_warning(vllm_config.compilation_config.custom_ops)
            if warning is not None:
                logger.warning("kvstore connector: %s", warning)
        self.identity = identity_from_vllm(vllm_config, self.layout, self._options.model_id, cpu_isa=self._cpu_isa)
        self._load_mode = load_mode(extra.get("async_load", True))
        self._pacing = LoadPacing()
        self._finish_wait = FinishWait() if _flag(extra, "load_finish_wait") else None
        self._started: list[str] = []  # the requests whose background loads this step started (the step's end may await)
        self._finish_counts = dict.fromkeys(("finish_waits", "finish_wait_hits", "finish_wait_seconds"), 0.0)
        self._bytes_per_token = self.layout.chunk_bytes / self.layout.chunk_tokens
        self.store = _acquire_store(self._options, self.layout, self.identity.model)
        self._groups = hybrid_groups(kv_cache_config, vllm_config.cache_config.mamba_cache_mode, self.layout)
        self._group_stores = [_acquire_store(self._options, g.layout, g.model_name(self.identity.model, self.layout.chunk_tokens))
                              for g in self._groups or []]
        self._plan_group = planning_group(self._groups) if self._groups else 0
        self._tables: dict[str, Tables] = {}  # hybrid models: each request's per-group block ids, as last seen
        lookup = (hybrid_lookup(self._groups, [s.lookup_keys for s in self._group_stores], self.layout.chunk_tokens)
                  if self._groups else self.store.lookup_keys)
        config = self._kv_transfer_config
        self._planner = ChunkPlanner(self._keys_of, lookup, chunk_tokens=self.layout.chunk_tokens,
                                     block_size=self._block_size, save_decode=_flag(extra, "save_decode"),
                                     loads=config.is_kv_consumer, saves=config.is_kv_producer,
                                     handoff_wait_s=handoff_wait_option(extra),
                                     save_tail=_flag(extra, "save_partial_chunk", config.kv_role == "kv_producer"))
        self._transfer: PagedTransfer | None = None
        self._hybrid: HybridTransfer | None = None
        self._load_tables: dict[str, Tables] = {}  # worker: the per-group block ids of the loads it was handed
        self._loads: AsyncLoads | None = None
        self._failed_blocks: set[int] = set()
        self._saved_finished: set[str] = set()  # finished requests whose answer chunks were gathered
        self._store_seen = dict.fromkeys(_STORE_COUNTERS, 0)  # the store's counters at the last stats call
        self._events = _saved_block_events(vllm_config, role, self._block_size, self.layout.chunk_tokens, extra)
        logger.info("kvstore connector (%s, %s) on %s, model %r", role.name.lower(), config.kv_role, self.layout,
                    self.identity.model)

    def _keys_of(self, request: VllmRequest) -> ChunkHasher | None:
        scope, tokens = request_scope(self.identity, request), request.prompt_token_ids
        if scope is None or tokens is None:  # no scope without token ids
            return None
        hasher = ChunkHasher(scope.root(self.store.root_key), self.layout.chunk_tokens)
        hasher.extend(tokens)
        return hasher

    # ----- scheduler side ---------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: VllmRequest, num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._events is not None:
            self._events.track(request)
        tokens = self._planner.num_new_matched_tokens(request.request_id, request, request.num_prompt_tokens,
                                                      num_computed_tokens,
                                                      Handoff.from_params(request.kv_transfer_params))
        background = tokens > 0 and in_background(self._load_mode, self._pacing, tokens * self._bytes_per_token,
                                                  self._planner.load_wait_s(request.request_id))
        self._planner.load_in_background(request.request_id, background)
        return tokens, background

    def update_state_after_alloc(self, request: VllmRequest, blocks: object, num_external_tokens: int) -> None:
        # blocks: vLLM's KVCacheBlocks, unused (the block ids come from its KV cache manager)
        if num_external_tokens > 0:
            assert self._kv_cache_manager is not None
            tables = self._kv_cache_manager.get_block_ids(request.request_id)
            self._note_tables(request.request_id, tables)
            self._planner.after_alloc(request.request_id, tables[self._plan_group], num_external_tokens)

    def build_connector_meta(self, scheduler_output: VllmSchedulerOutput) -> KVConnectorMetadata:
        assert self._kv_cache_manager is not None
        manager = self._kv_cache_manager
        group = self._plan_group
        scheduled = [ScheduledRequest(r.req_id, r.num_computed_tokens, scheduler_output.num_scheduled_tokens[r.req_id],
                                      self._note_tables(r.req_id, r.block_ids)[group])
                     for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            scheduled.append(ScheduledRequest(req_id, computed, scheduler_output.num_scheduled_tokens[req_id],
                                              self._note_tables(req_id, manager.get_block_ids(req_id))[group]))
        self._pacing.step_planned(len(scheduled))
        plan = self._planner.plan_step(scheduled)
        if self._events is not None:
            for spec in plan.saves:
                self._events.saved(spec.req_id, spec.start_token, spec.end_token)
            for req_id in plan.finished_saves:
                self._events.forget(req_id)
        return KVStoreConnectorMetadata(plan=plan, tables=self._ship_tables(plan))

    def _note_tables(self, req_id: str, tables: Sequence[Sequence[int]]) -> Sequence[Sequence[int]]:
        """Keep a hybrid model's per-group block ids for the worker (connector.vllm.hybrid)."""
        if self._groups is not None:
            self._tables[req_id] = tuple(tuple(ids) for ids in tables)
        return tables

    def _ship_tables(self, plan: StepPlan) -> dict[str, Tables]:
        if self._groups is None:
            return {}
        shipped = {s.req_id: self._tables[s.req_id] for s in (*plan.loads, *plan.saves) if s.req_id in self._tables}
        for req_id in plan.finished_saves:
            self._tables.pop(req_id, None)
        return shipped

    def take_events(self) -> list[object]:
        """BlockStored events, at vLLM's block hashes, for the blocks planned into kvstore since the last call;
        vLLM publishes them with its own (KVEventsConfig). Empty unless vLLM's KV events are enabled."""
        if self._events is None:
            return []
        from vllm.distributed.kv_events import BlockStored
        from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash

        def external(h: bytes | int | None) -> object:
            return None if h is None else maybe_convert_block_hash(BlockHash(h)) if isinstance(h, bytes) else h

        return [BlockStored(block_hashes=[external(h) for h in e.block_hashes], parent_block_hash=external(e.parent_block_hash),
                            token_ids=e.token_ids, block_size=e.block_size, lora_id=e.lora_id, medium=e.medium,
                            lora_name=e.lora_name, group_idx=e.group_idx, ownership=e.ownership)
                for e in self._events.take()]

    def update_connector_output(self, connector_output: VllmConnectorOutput) -> None:
        """A step's output: how long the step took, and what the workers' loads cost (load pacing)."""
        stats = connector_output.kv_connector_stats
        data = stats.data if isinstance(stats, KVStoreConnectorStats) else {}
        self._pacing.step_done(data.get("loaded_bytes", 0.0), data.get("load_seconds", 0.0))

    def request_finished_all_groups(self, request: VllmRequest,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, object] | None]:
        """vLLM's hybrid manager: the request's blocks in every KV cache group (connector.vllm.hybrid)."""
        self._note_tables(request.request_id, block_ids)
        delay, params = self.request_finished(request, block_ids[self._plan_group])
        if not delay:
            self._tables.pop(request.request_id, None)
        return delay, params

    def request_finished(self, request: VllmRequest, block_ids: list[int]) -> tuple[bool, dict[str, object] | None]:
        """Prompt chunks were saved in the steps that completed them; the answer's chunks (save_decode) are
        gathered in the next step, so vLLM keeps the blocks until the worker reports the request. A saving
        instance's answer names the prompt chunks it saved (connector.vllm.handoff), for a decode instance."""
        handoff = self._planner.handoff(request.request_id)
        delay = self._planner.finished(request.request_id, request.all_token_ids, request.num_computed_tokens,
                                       block_ids)
        if self._events is not None and not delay:  # a delayed save's event comes with the plan that saves it
            self._events.forget(request.request_id)
        return delay, handoff.to_params() if handoff is not None else None

    # ----- worker side ------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self._groups is not None:
            self._register_groups(kv_caches)
            return
        caches = [kv_caches[name] for name in sorted(kv_caches, key=extract_layer_index)]
        if len(caches) != self.layout.num_layers:
            raise ConfigError(f"vLLM registered {len(caches)} KV caches for a {self.layout.num_layers}-layer model")
        if self.layout.kind is AttentionKind.MLA:
            kind = detect_latent(caches[0], block_size=self._block_size, latent_dim=self.layout.head_dim)
        else:
            kind = detect_kind(caches[0], block_size=self._block_size, num_kv_heads=self.layout.num_kv_heads,
                               head_dim=self.layout.head_dim, cpu_isa=self._cpu_isa)
        tp_rank, pp_rank = _worker_ranks()
        role = shard_role(self.layout.kind, self._tp_size, tp_rank)
        self._transfer = PagedTransfer(self.store, caches, kind, self._block_size, tp_rank=role.key_tp_rank,
                                       pp_rank=pp_rank, writes=role.writes)
        self._loads = AsyncLoads(self._transfer.load, self._block_size)
        logger.info("kvstore connector: %d layer caches, %s layout%s%s", len(caches), kind.value,
                    f" (vLLM's CPU attention ISA {self._cpu_isa})" if self._cpu_isa else "",
                    "" if role.writes else f"; TP rank {tp_rank} loads, rank 0 saves (the same latent)")

    def _register_groups(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """A hybrid model: one PagedTransfer per KV cache group, over that group's layers and store."""
        assert self._groups is not None and self._kv_cache_config is not None
        tp_rank, pp_rank = _worker_ranks()
        transfers: list[GroupTransfer] = []
        for group, store, names in zip(self._groups, self._group_stores, group_layer_names(self._kv_cache_config),
                                       strict=True):
            caches = [kv_caches[name] for name in sorted(names, key=extract_layer_index)]
            if group.shape.kind is GroupKind.STATE:
                transfers.append(StateTransfer(store, caches, tp_rank=tp_rank, pp_rank=pp_rank))
                continue
            kind = detect_kind(caches[0], block_size=self._block_size, num_kv_heads=self.layout.num_kv_heads,
                               head_dim=self.layout.head_dim, cpu_isa=self._cpu_isa)
            transfers.append(PagedTransfer(store, caches, kind, self._block_size, tp_rank=tp_rank, pp_rank=pp_rank))
        self._hybrid = HybridTransfer(self._groups, transfers, self.layout.chunk_tokens)
        planning = transfers[self._plan_group]
        assert isinstance(planning, PagedTransfer)  # the planning group is a full-attention one
        self._transfer = planning
        self._loads = AsyncLoads(self._load_groups, self._block_size)
        logger.info("kvstore connector: %d KV cache groups (%s)", len(self._groups),
                    ", ".join(f"{g.shape.kind.value} x{g.shape.num_layers}" for g in self._groups))

    def _load_groups(self, spec: TransferSpec) -> set[int]:
        assert self._hybrid is not None
        return self._hybrid.load(spec, self._load_tables.pop(spec.req_id))

    def _plan(self) -> StepPlan:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStoreConnectorMetadata)
        return meta.plan

    def start_load_kv(self, forward_context: object, **kwargs: object) -> None:  # vLLM's ForwardContext, unused
        """Start this step's background loads on the loader threads; run its in-step loads now (the forward pass
        reads them). vLLM calls this before the forward pass when the step has an in-step load, else after it."""
        if self._transfer is None or self._loads is None:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStoreConnectorMetadata)
        self._load_tables.update(meta.tables)
        for spec in self._plan().loads:
            if spec.background:
                self._loads.start(spec)
                if spec.wait_s == 0:  # a handoff's load may wait for its chunks: never awaited at the step's end
                    self._started.append(spec.req_id)
            else:
                self._failed_blocks |= self._load_groups(spec) if self._hybrid else self._transfer.load(spec)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv filled every layer already

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: object, **kwargs: object) -> None:
        return  # saved whole chunks in wait_for_save, once every layer has its KV

    def wait_for_save(self) -> None:
        """Gather the chunks this step completed (blocks are free to reuse after); store them in the background."""
        if self._transfer is not None and self.has_connector_metadata():
            plan = self._plan()
            if self._hybrid is not None:
                meta = self._get_connector_metadata()
                assert isinstance(meta, KVStoreConnectorMetadata)
                self._hybrid.save(plan.saves, meta.tables)
            else:
                self._transfer.save(plan.saves)
            self._saved_finished.update(plan.finished_saves)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """(finished requests whose answer chunks are gathered: vLLM may free their blocks; requests whose
        background loads ended, their failed blocks already in get_block_ids_with_load_errors)."""
        sent, self._saved_finished = self._saved_finished, set()
        received: set[str] = set()
        if self._loads is not None:
            if self.has_connector_metadata() and self._plan().idle:
                self._loads.wait_any(IDLE_WAIT_S)
            self._await_started()
            received, failed = self._loads.finished()
            self._failed_blocks |= failed
        return sent or None, received or None

    def _await_started(self) -> None:
        """The step's end: wait briefly for the loads this step started (connector/vllm/finish_wait.py), so
        vLLM hears of them now and runs their requests in the next step rather than the one after."""
        started, self._started = self._started, []
        if self._finish_wait is None or self._loads is None:
            return
        budget = self._finish_wait.budget_s()
        if started and budget > 0:
            start = time.perf_counter()
            ended = self._loads.wait_for(started, budget)
            self._finish_counts["finish_waits"] += 1
            self._finish_counts["finish_wait_hits"] += int(ended)
            self._finish_counts["finish_wait_seconds"] += time.perf_counter() - start
        self._finish_wait.step_ended()

    def get_kv_connector_stats(self) -> KVStoreConnectorStats | None:
        """The figures since the last call: what the worker loaded and saved, and what the store cost."""
        if self._transfer is None:
            return None
        counters = self._hybrid.take_counters() if self._hybrid is not None else self._transfer.take_counters()
        stats = KVStoreConnectorStats(data=dict(counters))
        for name, value in self._finish_counts.items():
            stats.add(name, value)
        self._finish_counts = dict.fromkeys(self._finish_counts, 0.0)
        now = {name: self.store.counters[name] for name in _STORE_COUNTERS}
        for name, label in _STORE_COUNTERS.items():
            stats.add(label, now[name] - self._store_seen[name])
        self._store_seen = now
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: Mapping[str, float] | None = None) -> KVStoreConnectorStats | None:
        return KVStoreConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, metric_types: dict[type, type], labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> KVStorePromMetrics:
        return KVStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        if failed:
            logger.warning("kvstore connector: %d blocks failed to load; vLLM recomputes them", len(failed))
        return failed

    def flush(self) -> None:
        """Block until every chunk handed to the store so far is stored, on disk too (for tests and benches)."""
        self.store.flush()  # the save queue first, then the store's lower-tier writes

    def shutdown(self) -> None:
        if self._loads is not None:
            self._loads.close()
            self._loads = None
        if self._transfer is not None:
            (self._hybrid or self._transfer).wait()
            self._transfer = self._hybrid = None
        _release_store(self._options, self.layout)
        for group in self._groups or []:
            _release_store(self._options, group.layout)


def _saved_block_events(vllm_config: VllmConfig, role: KVConnectorRole, block_size: int, chunk_tokens: int,
                        extra: Mapping[str, object]) -> SavedBlockEvents | None:
    """The scheduler half's record of its saves as KV events, when vLLM publishes KV events at all."""
    events = vllm_config.kv_events_config
    if role != KVConnectorRole.SCHEDULER or events is None or not events.enable_kv_cache_events:
        return None
    return SavedBlockEvents(block_size, chunk_tokens, medium=str(extra.get("kv_events_medium", "CPU")))


def _flag(extra: Mapping[str, object], name: str, default: bool = True) -> bool:
    return parse_bool(extra.get(name, default), field=f"kv_connector_extra_config.{name}")


def _refuse_split_embedded(options: StoreOptions, vllm_config: VllmConfig) -> None:
    """An embedded store lives in one process; vLLM's scheduler and worker halves may not share one."""
    backend = vllm_config.parallel_config.distributed_executor_backend
    if options.url or backend in _ONE_PROCESS_BACKENDS:
        return
    raise ConfigError(f"kvstore's embedded store needs vLLM's scheduler and worker in one process, but vLLM runs "
                      f"its worker separately (distributed_executor_backend={backend!r}): start `kvstore serve` "
                      f"and set kv_connector_extra_config {{\"url\": \"http://127.0.0.1:8765\"}}")


def _worker_ranks() -> tuple[int, int]:
    """This worker's (tensor-parallel, pipeline-parallel) rank: which shard of the KV it holds."""

    return get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
