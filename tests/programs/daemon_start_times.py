"""How long a test waits for a daemon: `Daemon.start` in a fresh interpreter against one forked by the fork server,
interleaved in one run so both see the same machine load; prints each time and the ratio of the medians.

    python -m tests.programs.daemon_start_times [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from service.process import CLI, ChildProcess, Daemon, Launcher, popen_launcher, use_launcher, write_config
from tests.helpers.forkserver import ForkServer
from tests.service.conftest import LAYOUT


def _start_time(root: Path, launcher: Launcher) -> float:
    use_launcher(launcher)
    root.mkdir()
    daemon = Daemon(write_config(root, layout=LAYOUT, host_chunks=16), root / "daemon.log")
    begin = time.monotonic()
    daemon.start()
    took = time.monotonic() - begin
    assert daemon.stop() == 0
    return took


def main(rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="start-times-") as folder:
        server = ForkServer(Path(folder) / "forkserver.log")

        def forked(args: list[str], env: dict[str, str], log: Path) -> ChildProcess:
            return server.spawn([*CLI, *args], env=env, stdout=log)

        begin = time.monotonic()
        server.run(["-c", "pass"])
        print(f"fork server ready (torch and the web stack imported) in {time.monotonic() - begin:.2f} s")
        times: dict[str, list[float]] = {"fresh interpreter": [], "forked": []}
        for i in range(rounds):
            times["fresh interpreter"].append(_start_time(Path(folder) / f"cold{i}", popen_launcher))
            times["forked"].append(_start_time(Path(folder) / f"warm{i}", forked))
        server.close()
    return times


if __name__ == "__main__":
    result = main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    for kind, seconds in result.items():
        print(f"{kind:>17}: {' '.join(f'{s:.2f}' for s in seconds)} s, median {statistics.median(seconds):.2f} s")
    ratio = statistics.median(result["forked"]) / statistics.median(result["fresh interpreter"])
    print(f"forked = {ratio:.2f} x fresh interpreter (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
