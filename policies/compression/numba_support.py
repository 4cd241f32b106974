"""`optional_kernels`: import a module of numba kernels, or say once what runs without numba.

numba is a dependency, but a platform without a numba wheel (or a broken LLVM) must still run: the
codecs that use kernels keep a slower path (`lossy.py`'s torch path, `planes.py`'s numpy copies).
"""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType

logger = logging.getLogger(__name__)


@functools.cache
def optional_kernels(module: str, without: str) -> ModuleType | None:
    """The kernels `module`, or None when it does not import; `without` says what runs instead (logged once)."""
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        logger.warning("numba unavailable (%s): %s", exc, without)
        return None
    logger.info("numba kernels in use: %s", module)
    return loaded
