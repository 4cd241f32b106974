"""What the daemon does first, so that a process of its own uid reads nothing of it through /proc.

    make_undumpable()     prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/fd, /proc/<pid>/mem, /proc/<pid>/environ
                          and ptrace are refused to every process without CAP_SYS_PTRACE, even of
                          the same uid (the shared-memory clients' situation: the descriptor socket
                          is 0600, so they run as the daemon's uid); no core dump. Inherited by
                          forked children; an exec'd child is dumpable again, but inherits no
                          memfd (they are close-on-exec) and an environment without tokens.
    scrub_secret_env()    every environment variable holding a configured token leaves os.environ
                          once the config is read, so no child inherits it.

The environment the kernel copied at exec (/proc/<pid>/environ) cannot be changed afterwards; it
is unreadable to other processes once the daemon is non-dumpable. Tokens in files
(`token_file`, `admin_token_file`) never enter it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Iterable, MutableMapping

logger = logging.getLogger(__name__)
PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
ROLE_TOKEN_ENV = ("KVSTORE_ADMIN_TOKEN", "KVSTORE_METRICS_TOKEN")


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    result = int(libc.prctl(option, arg, 0, 0, 0))
    if result < 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
    return result


def make_undumpable() -> bool:
    """Mark this process non-dumpable (Linux); False, with a warning, where that is not possible."""
    if not sys.platform.startswith("linux"):
        logger.warning("not Linux: the daemon cannot make itself non-dumpable; run it as its own uid")
        return False
    try:
        _prctl(PR_SET_DUMPABLE, 0)
    except OSError as exc:
        logger.warning("prctl(PR_SET_DUMPABLE, 0) failed (%s): /proc/%d is readable by this uid", exc, os.getpid())
        return False
    return True


def is_dumpable() -> bool:
    return bool(_prctl(PR_GET_DUMPABLE))


def scrub_secret_env(tokens: Iterable[str | None], environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove from `environ` (os.environ) every variable whose value is one of `tokens`, and the role
    tokens' default variables. Returns the names removed."""
    env = os.environ if environ is None else environ
    secrets = {t for t in tokens if t}
    names = [k for k, v in env.items() if v in secrets or v.strip() in secrets or k in ROLE_TOKEN_ENV]
    for name in names:
        del env[name]
    return names
