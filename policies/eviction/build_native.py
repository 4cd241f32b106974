"""`python -m policies.eviction.build_native`: compile the hot eviction policies with mypyc (see `_native`)."""

from __future__ import annotations

import sys

from policies.eviction._native import build


def main() -> int:
    try:
        print(f"eviction policies compiled with mypyc in {build()}")
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
