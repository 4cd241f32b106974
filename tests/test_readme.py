"""README.md cannot drift: every ```bash and ```python block runs, as written, in a clean copy of the
repository (the files git tracks or would track, nothing of ../shared or the developer's caches). The
docs pages with commands (RUN_DOCS) run the same way, and every docs page is linked from the README.

Convention (an HTML comment on the line right before the fence):
    <!-- readme: skip (reason) -->     never run here; the reason is shown as the skip reason
    <!-- readme: integration -->       run only in the integration suite (`pytest -m integration`)
    <!-- readme: quick CMD -->         run the bash command CMD instead (a quicker variant)
Every ```toml block with [[tiers]] is also started with `kvstore serve`: it must either become
ready on this machine or be refused at once in one line (exit 2), never crash or hang.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import netns
from tests.integration.scheduling import fixed_port_blocks

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
RUN_DOCS = (README, *(REPO / "docs" / f"{page}.md" for page in (
    "integrations", "configuration", "operations", "security", "compression", "policies", "planning")))
RUN_LANGS = ("bash", "python")
DIRECTIVE = re.compile(r"^<!--\s*readme:\s*(skip|integration|quick)\b\s*(.*?)\s*-->\s*$")
BLOCK_TIMEOUT_S = 900


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    directive: str | None = None  # skip | integration | quick
    argument: str = ""
    source: str = "README.md"

    @property
    def id(self) -> str:
        prefix = "" if self.source == "README.md" else f"{Path(self.source).stem}-"
        return f"{prefix}L{self.line}-{self.lang}"


def readme_blocks(text: str, source: str = "README.md") -> list[Block]:
    """Fenced blocks of README text with their directives; malformed directives raise."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        previous = lines[i - 1].strip() if i else ""
        match = DIRECTIVE.match(previous)
        if previous.startswith("<!-- readme") and not match:
            raise ValueError(f"{source}:{i}: unknown readme directive {previous!r}")
        directive, argument = (match.group(1), match.group(2).strip("() ")) if match else (None, "")
        blocks.append(Block(fence.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1, directive, argument, source))
        i = end + 1
    return blocks


def _all_blocks() -> list[Block]:
    return [b for doc in RUN_DOCS for b in readme_blocks(doc.read_text(), str(doc.relative_to(REPO)))]


def _params() -> list:
    params = []
    for block in _all_blocks():
        if block.lang not in RUN_LANGS and block.directive != "quick":
            continue
        # an integration block starts engines (minutes on a loaded CPU): its own limit, not pytest's default
        marks = ([pytest.mark.integration, pytest.mark.timeout(BLOCK_TIMEOUT_S + 60)]
                 if block.directive == "integration" else [])
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository as a fresh clone would hold it (tracked and not-ignored files), in a temp dir."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    root = tmp_path_factory.mktemp("readme") / "kvstore"
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    return root


def _env(clone: Path) -> dict[str, str]:
    """This interpreter's environment (its `kvstore` script on PATH), the clone's packages first,
    caches in the clone, and the variables the README's samples name."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(clone),
            "KVSTORE_CACHE_DIR": str(clone / ".cache"), "TEAM_A_TOKEN": "readme-test-token", "COLUMNS": "160"}


@pytest.mark.parametrize("block", _params())
@pytest.mark.timeout(BLOCK_TIMEOUT_S)  # commands as a user types them (a replay sweep, the planner): minutes on 2 cores
def test_readme_block_runs_as_written(block: Block, clone: Path) -> None:
    if block.directive == "skip":
        pytest.skip(block.argument or "marked skip in README.md")
    if block.directive == "quick":
        cmd = ["bash", "-euo", "pipefail", "-c", block.argument]
    elif block.lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        script = clone / f".readme_block_{block.line}.py"
        script.write_text(block.code)
        cmd = [sys.executable, str(script)]
    if block.id in fixed_port_blocks() and netns.available():  # its own loopback: other blocks may run meanwhile
        cmd = netns.wrap(cmd)
    done = subprocess.run(cmd, cwd=clone, env=_env(clone), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, (f"{block.source} line {block.line} failed (exit {done.returncode}):\n{block.code}\n"
                                  f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}")


def test_directives_are_parsed_and_unknown_ones_fail() -> None:
    text = "a\n<!-- readme: quick echo hi -->\n```bash\nsleep 100\n```\n<!-- readme: skip (needs X) -->\n```python\nx\n```\n"
    quick, skip = readme_blocks(text)
    assert (quick.directive, quick.argument, quick.line) == ("quick", "echo hi", 3)
    assert (skip.directive, skip.argument, skip.lang) == ("skip", "needs X", "python")
    with pytest.raises(ValueError, match="unknown readme directive"):
        readme_blocks("<!-- readme: skipp -->\n```bash\nx\n```\n")


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in _all_blocks()
                                   if b.lang == "toml" and "[[tiers]]" in b.code])
def test_readme_config_sample_starts_or_is_refused_at_once(block: Block, clone: Path) -> None:
    """The sample config works on this machine or fails at once with the reason (one line, exit 2)."""
    from service.process import free_port, serve_command_line

    config = clone / f".readme_sample_{block.line}.toml"
    config.write_text(block.code)
    proc = subprocess.Popen(serve_command_line(config, "--port", str(free_port())), cwd=clone, env=_env(clone),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # still running: it must have come up
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert "ready at" in err, err[-3000:]
        return
    lines = [line for line in err.splitlines() if line.strip()]
    if proc.returncode == 2:
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert "; " in lines[0], f"the refusal names no fix: {lines[0]}"
        print(f"refused: {lines[0]}")
    else:
        pytest.fail(f"kvstore serve exited {proc.returncode} without being ready:\n{err[-3000:]}")


def test_every_docs_page_is_linked_from_the_readme() -> None:
    """The README is the front door: a page no link reaches is a page nobody finds."""
    text = README.read_text()
    pages = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
    assert [page for page in pages if f"]({page})" not in text] == []


def test_readme_stays_a_front_door() -> None:
    """What, the two commands, quick starts and links: topics live in docs/ pages."""
    assert len(README.read_text().splitlines()) <= 450
