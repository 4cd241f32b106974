"""Contend 60 times for the PFS eviction lease KEY; inside, claim MARKER with O_EXCL (exists = someone else is inside);
print how many times it held the lease and how many times it found another holder inside.

    python -m tests.programs.lease_contender REDIS_URL NAME MARKER KEY
"""

from __future__ import annotations

import os
import sys
import time

import redis

from kvstore.cluster.lease import RedisLease


def main(url: str, name: str, marker: str, key: str) -> tuple[int, int]:
    lease = RedisLease(redis.Redis.from_url(url), key, name, ttl_s=5)
    held_times = violations = 0
    for _ in range(60):
        with lease.hold() as held:
            if not held:
                time.sleep(0.001)
                continue
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                violations += 1
                continue
            held_times += 1
            time.sleep(0.002)  # a stay inside, so overlapping holders would meet
            os.close(fd)
            os.unlink(marker)
    return held_times, violations


if __name__ == "__main__":
    print(*main(*sys.argv[1:5]))
