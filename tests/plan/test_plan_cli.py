"""`kvstore plan` end to end: the real command, its JSON, its PNG, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from kvstore.cli import app


def test_plan_command_writes_json_and_png(tmp_path: Path) -> None:
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    proc = subprocess.run([str(Path(sys.executable).parent / "kvstore"), "plan", "--model", "llama-3-8b", "--gpus", "1",
                           "--sessions", "20", "--turns", "3", "--host-ram", "4GiB", "--json", str(out), "--plot", str(png)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "131,072 B/token" in proc.stdout and "tiers for the target" in proc.stdout
    plan = json.loads(out.read_text())
    assert plan["bytes_per_token"] == 131_072
    assert {t["name"] for t in plan["tiers"]} == {"gpu", "host", "nvme", "pfs"}
    assert all(isinstance(t["recommended_capacity_bytes"], int) for t in plan["tiers"])
    assert plan["tiers"][0]["tier_gbps"] is None  # the GPU prefix cache is in place: infinite, written as null
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_on_a_mooncake_trace_with_a_ttft_target(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": i * 100, "input_length": 2048, "output_length": 10, "hash_ids": [0, 1, 2, 3 + i]}
            for i in range(20)]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["plan", "--model", "llama-3-70b", "--trace", str(trace), "--target-ttft-ms", "500",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["bytes_per_token"] == 327_680
    assert plan["workload"]["num_distinct_blocks"] == 23 and plan["target"]["ttft_ms"] == 500


def test_unknown_model_is_a_usage_error_listing_presets() -> None:
    result = CliRunner().invoke(app, ["plan", "--model", "gpt-5"])
    assert result.exit_code == 2
    assert "llama-3-70b" in result.output
