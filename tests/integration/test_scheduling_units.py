"""The integration run's scheduling units (tests/integration/scheduling.py): README blocks on fixed ports share one
where blocks cannot each have a network namespace (tests/helpers/netns.py), and are units of their own where they can."""

from __future__ import annotations

import pytest

from tests.helpers import netns
from tests.integration.scheduling import README, fixed_port_blocks, readme_unit
from tests.test_readme import _all_blocks


def test_the_readme_engine_blocks_on_fixed_ports_share_one_unit_without_namespaces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "available", lambda: False)  # a container that forbids namespaces
    engine_blocks = [b for b in _all_blocks() if b.directive == "integration"]
    on_ports = [b for b in engine_blocks if "8765" in b.code or "--port" in b.code]
    assert len(on_ports) >= 2, "the premise: the README's `vllm serve` and prefill/decode blocks bind 8765 and 8000"
    units = {readme_unit(f"{README}::test_readme_block_runs_as_written[{b.id}]") for b in on_ports}
    assert units == {f"{README}::fixed-ports"}
    assert {b.id for b in on_ports} <= fixed_port_blocks()


def test_a_block_without_fixed_ports_keeps_a_unit_of_its_own() -> None:
    free = [b for b in _all_blocks() if b.directive == "integration" and b.id not in fixed_port_blocks()]
    assert free, "the premise: the README's `LLM` block starts its daemon on a free port"
    nodeid = f"{README}::test_readme_block_runs_as_written[{free[0].id}]"
    assert readme_unit(nodeid) == nodeid


def test_with_namespaces_each_block_on_fixed_ports_is_a_unit_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "available", lambda: True)
    on_ports = sorted(fixed_port_blocks())
    units = {readme_unit(f"{README}::test_readme_block_runs_as_written[{block}]") for block in on_ports}
    assert len(units) == len(on_ports) >= 2
