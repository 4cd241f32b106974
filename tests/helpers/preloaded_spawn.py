"""`python -m tests.helpers.preloaded_spawn EXECUTABLE -m MODULE ARGS...`: `python -m MODULE ARGS...` whose
multiprocessing spawns go through EXECUTABLE (a SpawnServer's trampoline, tests/helpers/spawn_server.py)."""

from __future__ import annotations

import multiprocessing
import sys

from tests.helpers import forked_child


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] not in ("-c", "-m"):
        raise SystemExit("usage: python -m tests.helpers.preloaded_spawn EXECUTABLE (-m MODULE | -c CODE) ARGS...")
    multiprocessing.set_executable(argv[0])
    forked_child.run_argv(argv[1:])  # as `python -m MODULE`: MODULE is __main__, which spawn's children import


if __name__ == "__main__":
    main(sys.argv[1:])
