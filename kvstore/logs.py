"""`set_log_level`: INFO (or DEBUG) for kvstore's own packages, WARNING for every library (torch, numexpr...).

The CLI's `--verbose` and `kvstore serve --log-level info` show kvstore's lifecycle lines; a library's
INFO lines (torch's at SIGINT during start-up, numexpr's thread count) are not the operator's business.
"""

from __future__ import annotations

import logging

OWN_PACKAGES = ("kvstore", "service", "tiers", "policies", "connector", "gpu_kernels", "bench")


def set_log_level(level: int) -> None:
    """`level` for kvstore's packages; the root logger (every library) stays at WARNING or above."""
    logging.getLogger().setLevel(max(level, logging.WARNING))
    for name in OWN_PACKAGES:
        logging.getLogger(name).setLevel(level)
