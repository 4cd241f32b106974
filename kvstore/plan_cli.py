"""`kvstore plan`: size each tier for a model, a workload (trace or parameters) and the hardware."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

logger = logging.getLogger(__name__)

_HW = "hardware"
_WL = "workload (without --trace; --rps also rescales a trace)"


def plan_command(
    model: Annotated[str, typer.Option("--model", help="Preset (llama-3-8b, llama-3-70b, qwen2.5-7b, mistral-7b, "
                                       "deepseek-v3) or a Hugging Face config.json")] = "llama-3-8b",
    trace: Annotated[Path | None, typer.Option("--trace", help="Mooncake JSONL (hash_ids) or Azure CSV")] = None,
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

    try:
        if validate:
            from kvstore.plan.validate import run_validate

            run_validate(trace=trace, json_path=json_path)
            return
        _plan(**locals())
    except KVStoreError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _plan(**opts: object) -> None:
    from kvstore.plan.inputs import HardwareSpec, Target, WorkloadParams
    from kvstore.plan.model_cost import load_model
    from kvstore.plan.planner import Planner, PlanInputs
    from kvstore.plan.report import print_plan, write_json, write_plot
    from kvstore.plan.workload import load_trace, parametric_trace
    from kvstore.units import parse_bytes

    o = dict(opts)
    model = load_model(str(o["model"]), kv_dtype=str(o["kv_dtype"]), codec=str(o["codec"]))
    hw = HardwareSpec(gpus=o["gpus"], gpu_mem_bytes=parse_bytes(o["gpu_mem"], field="--gpu-mem"), gpu_tflops=o["gpu_tflops"],
                      mfu=o["mfu"], host_bytes=parse_bytes(o["host_ram"], field="--host-ram"), host_gbps=o["host_gbps"],
                      nvme_bytes=parse_bytes(o["nvme_size"], field="--nvme-size"), nvme_gbps=o["nvme_gbps"],
                      pfs_bytes=parse_bytes(o["pfs_size"], field="--pfs-size"), pfs_gbps=o["pfs_gbps"],
                      nodes=o["nodes"], nic_gbps=o["nic_gbps"])  # type: ignore[arg-type]
    if o["trace"] is not None:
        trace, note = load_trace(o["trace"], block_tokens=model.layout.chunk_tokens, sessions=o["sessions"],  # type: ignore[arg-type]
                                 repeat_share=o["repeat_share"])  # type: ignore[arg-type]
    else:
        params = WorkloadParams(rps=o["rps"] or 1.0, prompt_tokens=o["prompt_tokens"], output_tokens=o["output_tokens"],
                                repeat_share=o["repeat_share"], sessions=o["sessions"], turns=o["turns"])  # type: ignore[arg-type]
        trace, note = parametric_trace(params, block_tokens=model.layout.chunk_tokens), "parametric model (see plan docs)"
    has_target = o["target_hit_rate"] is not None or o["target_ttft_ms"] is not None
    target = Target(hit_rate=o["target_hit_rate"], ttft_ms=o["target_ttft_ms"]) if has_target else None  # type: ignore[arg-type]
    plan = Planner(PlanInputs(model=model, hardware=hw, trace=trace, workload_note=note, target=target,
                              policy=str(o["policy"]), rps=o["rps"])).run()  # type: ignore[arg-type]
    print_plan(plan)
    if o["json_path"] is not None:
        write_json(plan, o["json_path"])  # type: ignore[arg-type]
        typer.echo(f"wrote {o['json_path']}")
    if o["plot"] is not None:
        write_plot(plan, o["plot"])  # type: ignore[arg-type]
        typer.echo(f"wrote {o['plot']}")
