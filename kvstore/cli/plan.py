"""`kvstore plan`: size each tier for a model, a workload (trace or parameters) and the hardware."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from kvstore.plan.inputs import HardwareSpec, WorkloadParams
    from kvstore.plan.model_cost import ModelSpec
    from kvstore.plan.plan_record import Plan
    from kvstore.sim.trace import Trace

logger = logging.getLogger(__name__)

_HW = "hardware"
_WL = "workload (without --trace; --rps rescales a trace, --sessions/--repeat-share set the Azure CSV reuse model)"


def plan_command(
    model: Annotated[str, typer.Option("--model", help="Preset (llama-3-8b, llama-3-70b, qwen2.5-7b, mistral-7b, "
                                       "deepseek-v3) or a Hugging Face config.json")] = "llama-3-8b",
    trace: Annotated[Path | None, typer.Option("--trace", help="Mooncake JSONL (hash_ids), Azure CSV, or a bundled "
                                                     "trace: mooncake-sample, azure-sample")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the plan as JSON here")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write hit rate and TTFT against capacity as PNG")] = None,
    validate: Annotated[bool, typer.Option("--validate", help="Measure this machine's store and compare")] = False,
    gpus: Annotated[int, typer.Option(help="GPUs per model replica", rich_help_panel=_HW)] = 8,
    gpu_mem: Annotated[str, typer.Option(help="Memory of one GPU", rich_help_panel=_HW)] = "80GiB",
    gpu_tflops: Annotated[float, typer.Option(help="Dense bf16 TFLOP/s of one GPU", rich_help_panel=_HW)] = 989.0,
    mfu: Annotated[float, typer.Option(help="Share of peak FLOP/s prefill reaches", rich_help_panel=_HW)] = 0.5,
    host_ram: Annotated[str, typer.Option(help="Host RAM the store may use", rich_help_panel=_HW)] = "1TiB",
    host_gbps: Annotated[float, typer.Option(help="Host->GPU GB/s per GPU (PCIe)", rich_help_panel=_HW)] = 25.0,
    nvme_size: Annotated[str, typer.Option(help="NVMe the store may use", rich_help_panel=_HW)] = "8TiB",
    nvme_gbps: Annotated[float, typer.Option(help="NVMe read GB/s of the node", rich_help_panel=_HW)] = 12.0,
    pfs_size: Annotated[str, typer.Option(help="PFS space the store may use", rich_help_panel=_HW)] = "1024TiB",
    pfs_gbps: Annotated[float, typer.Option(help="Aggregate PFS GB/s", rich_help_panel=_HW)] = 100.0,
    nodes: Annotated[int, typer.Option(help="Nodes sharing the PFS", rich_help_panel=_HW)] = 1,
    nic_gbps: Annotated[float, typer.Option(help="NIC GB/s of one node", rich_help_panel=_HW)] = 50.0,
    rps: Annotated[float | None, typer.Option(help="Requests/s", rich_help_panel=_WL)] = None,
    prompt_tokens: Annotated[int, typer.Option(help="New prompt tokens per turn", rich_help_panel=_WL)] = 2048,
    output_tokens: Annotated[int, typer.Option(help="Answer tokens per turn", rich_help_panel=_WL)] = 256,
    repeat_share: Annotated[float, typer.Option(help="Share of the prompt that repeats", rich_help_panel=_WL)] = 0.5,
    sessions: Annotated[int, typer.Option(help="Conversations", rich_help_panel=_WL)] = 200,
    turns: Annotated[int, typer.Option(help="Turns per conversation", rich_help_panel=_WL)] = 4,
    target_hit_rate: Annotated[float | None, typer.Option(help="Target token hit rate in (0, 1]")] = None,
    target_ttft_ms: Annotated[float | None, typer.Option(help="Target mean TTFT in ms")] = None,
    policy: Annotated[str, typer.Option(help="Eviction policy replayed (registry name)")] = "lru",
    kv_dtype: Annotated[str, typer.Option(help="dtype the engine keeps KV in")] = "bfloat16",
    codec: Annotated[str, typer.Option(help="How the store keeps KV: none, fp8, int8")] = "none",
) -> None:
    """Plan host/NVMe/PFS capacity, bandwidth and TTFT for a model and a workload (trace replay)."""
    from kvstore.errors import KVStoreError
    from kvstore.plan.inputs import WorkloadParams
    from kvstore.plan.model_cost import load_model

    try:
        if trace is not None:
            from kvstore.bundled import resolve_trace

            trace = resolve_trace(trace)
        if validate:
            from kvstore.plan.validate import run_validate

            run_validate(trace=trace, json_path=json_path)
            return
        spec = load_model(model, kv_dtype=kv_dtype, codec=codec)
        hw = _hardware(gpus=gpus, gpu_mem=gpu_mem, gpu_tflops=gpu_tflops, mfu=mfu, host_ram=host_ram,
                       host_gbps=host_gbps, nvme_size=nvme_size, nvme_gbps=nvme_gbps, pfs_size=pfs_size,
                       pfs_gbps=pfs_gbps, nodes=nodes, nic_gbps=nic_gbps)
        params = WorkloadParams(rps=rps or 1.0, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                repeat_share=repeat_share, sessions=sessions, turns=turns)
        plan = _plan(spec, hw, params, trace, policy=policy, rps=rps, target_hit_rate=target_hit_rate,
                     target_ttft_ms=target_ttft_ms)
    except KVStoreError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _report(plan, json_path, plot)


def _hardware(*, gpus: int, gpu_mem: str, gpu_tflops: float, mfu: float, host_ram: str, host_gbps: float,
              nvme_size: str, nvme_gbps: float, pfs_size: str, pfs_gbps: float, nodes: int,
              nic_gbps: float) -> HardwareSpec:
    """The hardware options as a HardwareSpec (sizes parsed; a bad one names its option)."""
    from kvstore.plan.inputs import HardwareSpec
    from kvstore.units import parse_bytes

    return HardwareSpec(gpus=gpus, gpu_mem_bytes=parse_bytes(gpu_mem, field="--gpu-mem"), gpu_tflops=gpu_tflops,
                        mfu=mfu, host_bytes=parse_bytes(host_ram, field="--host-ram"), host_gbps=host_gbps,
                        nvme_bytes=parse_bytes(nvme_size, field="--nvme-size"), nvme_gbps=nvme_gbps,
                        pfs_bytes=parse_bytes(pfs_size, field="--pfs-size"), pfs_gbps=pfs_gbps, nodes=nodes,
                        nic_gbps=nic_gbps)


def _plan(spec: ModelSpec, hw: HardwareSpec, params: WorkloadParams, trace: Path | None, *, policy: str,
          rps: float | None, target_hit_rate: float | None, target_ttft_ms: float | None) -> Plan:
    """Replay the workload (the trace, else the parametric model) against the tiers and size them."""
    from kvstore.plan.inputs import Target
    from kvstore.plan.planner import PlanInputs, Planner

    workload, note = _workload(trace, params, spec.layout.chunk_tokens)
    has_target = target_hit_rate is not None or target_ttft_ms is not None
    goal = Target(hit_rate=target_hit_rate, ttft_ms=target_ttft_ms) if has_target else None
    return Planner(PlanInputs(model=spec, hardware=hw, trace=workload, workload_note=note, target=goal,
                              policy=policy, rps=rps)).run()


def _workload(trace: Path | None, params: WorkloadParams, block_tokens: int) -> tuple[Trace, str]:
    from kvstore.plan.workload import parametric_trace
    from kvstore.sim.trace_files import load_trace

    if trace is not None:
        return load_trace(trace, block_tokens=block_tokens, sessions=params.sessions, repeat_share=params.repeat_share)
    return parametric_trace(params, block_tokens=block_tokens), "parametric conversation model (kvstore/plan/workload.py)"


def _report(plan: Plan, json_path: Path | None, plot: Path | None) -> None:
    from kvstore.plan.report import print_plan, write_json, write_plot

    print_plan(plan)
    if json_path is not None:
        write_json(plan, json_path)
        typer.echo(f"wrote {json_path}")
    if plot is not None:
        write_plot(plan, plot)
        typer.echo(f"wrote {plot}")
