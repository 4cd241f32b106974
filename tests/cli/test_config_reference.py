"""The settings table in docs/configuration.md is the one `kvstore config reference` generates from the typed
config classes, and every field of those classes has a description (a new setting cannot go undocumented)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.cli.config_reference import BEGIN, END, attribute_docs, reference, replaced
from kvstore.config import StoreConfig, TierConfig
from service.config import ServiceConfig, TenantConfig

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"


def test_the_page_holds_the_generated_table() -> None:
    text = PAGE.read_text()
    assert replaced(text, reference()) == text, "stale: run `kvstore config reference --write docs/configuration.md`"


@pytest.mark.parametrize("cls", [StoreConfig, TierConfig, ServiceConfig, TenantConfig])
def test_every_field_is_described(cls: type) -> None:
    undocumented = {f.name for f in dataclasses.fields(cls)} - set(attribute_docs(cls)) - {"layout", "tiers", "tenants"}
    assert undocumented == set()


def test_the_command_prints_the_table() -> None:
    done = subprocess.run([sys.executable, "-c", "from kvstore.cli import app; app()", "config", "reference"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == reference() and "| `[[tiers]]` | `capacity` | required |" in done.stdout


def test_replacing_needs_the_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        replaced("no markers here", "table")
    assert replaced(f"a\n{BEGIN}\nold\n{END}\nb", "new\n") == f"a\n{BEGIN}\nnew\n{END}\nb"
