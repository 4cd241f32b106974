"""`optional_kernels`: import a module of numba kernels, or say once what runs without numba.

numba is a dependency, but a platform without a numba wheel (or a broken LLVM) must still run: the
codecs that use kernels keep a slower path (`lossy.py`'s torch path, `planes.py`'s numpy copies).
The kernels' compiled cache (`cache=True`) goes to numba/ under the user's cache directory
(platformdirs), never into the source tree's __pycache__; NUMBA_CACHE_DIR, when set, wins.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)


@functools.cache
def optional_kernels(module: str, without: str) -> ModuleType | None:
    """The kernels `module`, or None when it does not import; `without` says what runs instead (logged once)."""
    use_user_cache_dir()
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        logger.warning("numba unavailable (%s): %s", exc, without)
        return None
    logger.info("numba kernels in use: %s", module)
    return loaded


def use_user_cache_dir() -> str:
    """Point numba's cache at the user's cache directory (unless NUMBA_CACHE_DIR is set); returns it."""
    if "NUMBA_CACHE_DIR" not in os.environ:
        import platformdirs

        os.environ["NUMBA_CACHE_DIR"] = str(Path(platformdirs.user_cache_dir("kvstore")) / "numba")
        if "numba" in sys.modules:  # imported already (by another library): make it read the variable again
            sys.modules["numba"].core.config.reload_config()
    return os.environ["NUMBA_CACHE_DIR"]
