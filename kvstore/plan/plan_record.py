"""The plan `Planner.run` returns and `kvstore plan --json` writes: its sections as TypedDicts."""

from __future__ import annotations

from typing import TypedDict


class ModelSection(TypedDict):
    name: str
    layout: dict[str, int | str]  # KVLayout.to_dict()
    codec: str
    num_params: int
    num_active_params: int
    weight_bytes: int


class WorkloadSection(TypedDict):
    num_requests: int
    duration_s: float
    rps: float
    mean_prompt_tokens: float
    num_accesses: int
    num_distinct_blocks: int
    block_tokens: int
    rps_used: float
    source: str
    block_ids: str  # how the block ids were obtained
    block_bytes: int


class TargetSection(TypedDict):
    hit_rate: float | None
    ttft_ms: float | None


class TierRow(TypedDict):
    name: str
    hardware_capacity_bytes: int
    recommended_capacity_bytes: int
    fits: bool
    token_share: float
    tier_gbps: float
    read_gbps: float
    write_gbps: float
    utilization: float
    breakeven_tokens: float
    load_ms_mean_prompt: float


class HostMemorySection(TypedDict):
    host_tier_bytes: int
    daemon_chunk_state_bytes: int  # the daemon's index, tier records, policy state and ledger for the chunks held
    daemon_bytes_per_disk_chunk: int
    total_bytes: int
    fits: bool  # total_bytes within the host memory given


class TTFTSection(TypedDict):
    recompute_all: float
    without_store: float
    with_store: float
    with_store_full_hardware: float


class CurveRow(TypedDict):
    capacity_blocks: int
    capacity_bytes: int
    hit_rate: float
    min_hit_rate: float
    block_hit_rate: float
    ttft_ms: float


class Plan(TypedDict):
    model: ModelSection
    bytes_per_token: int
    bytes_per_request: float
    workload: WorkloadSection
    working_set: list[dict[str, float]]
    hardware: dict[str, object]  # HardwareSpec as given
    policy: str
    target: TargetSection
    target_met: bool
    need_bytes: int | None
    tiers: list[TierRow]
    host_memory: HostMemorySection
    hit_rate: float
    hardware_hit_rate: float
    ttft_ms: TTFTSection
    hit_rate_curve: list[CurveRow]
    pfs_scaling: list[dict[str, float]]
