"""`python -m policies.eviction.build_native`: compile the hot eviction policies with mypyc (see `_native`)."""

from __future__ import annotations

import importlib.util
import sys

from policies.eviction._native import build


def main() -> int:
    if importlib.util.find_spec("mypyc") is None:
        print("python -m policies.eviction.build_native needs mypyc, which comes with mypy in the 'test' extra: "
              "bash scripts/setup.sh test (or pip install -e '.[test]'); the pure-Python policies run meanwhile",
              file=sys.stderr)
        return 2
    try:
        print(f"eviction policies compiled with mypyc in {build()}")
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
