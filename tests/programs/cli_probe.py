"""Run the `kvstore` command in this fresh interpreter and report which heavy modules it loaded.

    python -m tests.programs.cli_probe help ARGS...     exit status 0; none of HEAVY loaded; prints "usage ok"
    python -m tests.programs.cli_probe refused ARGS...  exit status 2; torch not loaded; prints "refused without torch"

Run it in a new interpreter (subprocess), never through the fork server: that one has torch imported already.
"""

from __future__ import annotations

import sys

HEAVY = ["torch", "uvicorn", "fastapi", "connector.engine", "kvstore.store", "numpy"]


def _run_cli(args: list[str]) -> int:
    from kvstore.cli import app

    try:
        app(args)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0


def main(mode: str, args: list[str]) -> str:
    code = _run_cli(args)
    if mode == "help":
        assert code == 0, code
        loaded = [name for name in HEAVY if name in sys.modules]
        assert not loaded, f"--help imported {loaded}"
        return "usage ok"
    assert code == 2, code
    assert "torch" not in sys.modules, "the refusal imported torch"
    return "refused without torch"


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2:]))
