"""`kvstore bench` finds every suite, including those whose module has another name, and the LMCache
comparison says in one line that it cannot run where LMCache is not installed, exiting 0."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.cli.bench import BENCH_SUITES, PLOTTING_SUITES, SUITE_MODULES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("suite", BENCH_SUITES)
def test_every_suite_names_a_module_with_run(suite: str) -> None:
    if suite in ("vllm", "lmcache") and importlib.util.find_spec("lmcache" if suite == "lmcache" else "vllm") is None:
        assert (REPO / "bench" / f"{SUITE_MODULES.get(suite, suite)}.py").is_file()
        return
    module = importlib.import_module(f"bench.{SUITE_MODULES.get(suite, suite)}")
    assert callable(module.run)


@pytest.mark.skipif(importlib.util.find_spec("lmcache") is not None, reason="LMCache is installed: the bench would run")
def test_lmcache_bench_without_lmcache_says_so_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "lmcache.json"
    done = subprocess.run([sys.executable, "-c", "from kvstore.cli import app; app()", "bench", "lmcache",
                           "--quick", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "LMCache is not installed" in line]
    assert len(lines) == 1 and "integration" in lines[0]
    assert json.loads(out.read_text())["records"] == []


@pytest.mark.parametrize("suite", PLOTTING_SUITES)
def test_plotting_suites_take_the_chart_path(suite: str) -> None:
    """`--plot PATH` is where the chart goes; a suite draws nowhere else (it once wrote into docs/bench/)."""
    source = (REPO / "bench" / f"{SUITE_MODULES.get(suite, suite)}.py").read_text()
    assert "plot: Path | None = None" in source and '"docs"' not in source


def test_plot_for_a_suite_without_a_chart_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "from kvstore.cli import app; app()", "bench", "tiers", "--quick",
                           "--plot", str(tmp_path / "x.png")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "draws no chart" in done.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(("args", "message"), [(["tiers", "--workload", "qa"], "has one workload"),
                                                (["serving", "--quick", "--workload", "long-doc"], "use one of mooncake, qa")])
def test_a_workload_the_suite_does_not_have_is_refused_in_one_line(args: list[str], message: str) -> None:
    """`--workload` is serving's (mooncake or qa); anything else is refused before a server starts."""
    done = subprocess.run([sys.executable, "-c", "from kvstore.cli import app; app()", "bench", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and message in done.stderr
