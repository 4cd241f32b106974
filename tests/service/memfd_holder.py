"""A child program of tests/service/test_proc_probe.py: the dumpable control the /proc probe reads.

    python -m tests.service.memfd_holder MARKER

Writes MARKER into a memfd it keeps open (as the daemon keeps its segments), prints "ready" and
sleeps until killed. Its environment is whatever the test gave it.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    fd = os.memfd_create("kvstore-control")
    os.write(fd, sys.argv[1].encode())
    print("ready", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
