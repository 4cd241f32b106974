"""How the integration run shares its tests between pytest-xdist workers: the longest modules first, and each of
tests/test_readme.py's blocks a unit of its own.

scripts/test.sh runs the suite with `-n 2 --dist loadfile --no-loadscope-reorder`: each worker takes whole files, in
collection order, as it runs out of work. Starting vLLM engines is most of the time, and the README's engine blocks
(`vllm serve` alone, prefill/decode behind the proxy, vLLM's `LLM` in Python) are one file: as one unit, one worker ran
them one after another while the other had finished. Apart, the two workers share them; a block needs nothing of
another (each runs in the module's clean copy of the repository, made again if a worker comes back to the file),
except the ports it binds: the blocks that bind fixed ports (a daemon on 8765, vLLM or the proxy on 8000) each run in a
network namespace of their own (tests/helpers/netns.py), or, where the machine allows none, stay one unit, run one
after another on one worker (two at once: "connection refused", or one block talking to the other's daemon).
"""

from __future__ import annotations

import functools
import re

from xdist.scheduler import LoadFileScheduling

from tests.helpers import netns

README = "tests/test_readme.py"
# The longest first (a run's --durations summed per module, README blocks together): the last units to start are
# short, so neither worker is left alone with a long one at the end. A module not listed runs after these.
LONG_MODULES = ("tests/integration/test_vllm_pd.py", README, "tests/integration/test_vllm.py",
                "tests/integration/test_vllm_scope.py", "tests/integration/test_vllm_serve.py",
                "tests/integration/test_vllm_two_models.py", "tests/integration/test_vllm_pd_proxy.py",
                "tests/integration/test_lmcache.py")


FIXED_PORT = re.compile(r"--port\s+\"?\d|(127\.0\.0\.1|localhost):\d")


@functools.cache
def fixed_port_blocks() -> frozenset[str]:
    """The ids of the README blocks that bind or call fixed ports."""
    from tests.test_readme import _all_blocks

    return frozenset(block.id for block in _all_blocks() if FIXED_PORT.search(block.code))


def readme_unit(nodeid: str) -> str:
    """A README block's scheduling unit: its own, or, where no block can have a network of its own
    (tests/helpers/netns.py), the one unit of every block on fixed ports."""
    block_id = nodeid.rsplit("[", 1)[-1].rstrip("]")
    shared_ports = block_id in fixed_port_blocks() and not netns.available()
    return f"{README}::fixed-ports" if shared_ports else nodeid


def module_rank(nodeid: str) -> int:
    """The module's place in LONG_MODULES (len(LONG_MODULES) for one not listed): the sort key of collection."""
    module = nodeid.split("::", 1)[0]
    return LONG_MODULES.index(module) if module in LONG_MODULES else len(LONG_MODULES)


class IntegrationScheduling(LoadFileScheduling):
    """--dist loadfile, except that each README block is a unit of its own (those on fixed ports one together)."""

    def _split_scope(self, nodeid: str) -> str:
        return readme_unit(nodeid) if nodeid.startswith(f"{README}::") else super()._split_scope(nodeid)
