"""Make Numba's on-disk cache of nbgrad's kernels fail safe.

Numba raises when a cache index or data file is truncated or corrupt, and when a
cache folder is read-only at save time. For files that belong to nbgrad (its
package folder and its cache folder) this guard turns both into a recompile (or an
unsaved result) and one warning; every other Numba cache behaves as before.
Caches of an older nbgrad or Numba never meet newer code: the cache folder is keyed by
both versions, and Numba's index is keyed by the source file's stamp.
"""

from __future__ import annotations

import glob
import os
import warnings

from numba.core import caching

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_WARNED: set[str] = set()
_INSTALLED = False


def _ours(cache: caching.Cache) -> bool:
    path = getattr(cache, "_cache_path", "") or ""
    if path.startswith(_PACKAGE_DIR):
        return True
    from .codegen import base_cache_dir
    return path.startswith(str(base_cache_dir()))


def _warn_once(kind: str, message: str) -> None:
    if kind not in _WARNED:
        _WARNED.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _drop_damaged(cache: caching.Cache) -> None:
    """Remove the index and data files of one cached function."""
    index = cache._cache_file._index_path
    stem = index[:-len(".nbi")]
    for path in [index, *glob.glob(stem + ".*.nbc")]:
        try:
            os.unlink(path)
        except OSError:
            pass


def install() -> None:
    """Wrap ``Cache.load_overload`` / ``save_overload`` (once per process)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    load, save = caching.Cache.load_overload, caching.Cache.save_overload

    def guarded_load(self, sig, target_context):
        try:
            return load(self, sig, target_context)
        except Exception as exc:  # a damaged cache entry: recompile
            if not _ours(self):
                raise
            _warn_once("load", f"nbgrad: the compile cache in {self._cache_path} was damaged "
                               f"({type(exc).__name__}: {exc}); recompiling")
            _drop_damaged(self)
            return None

    def guarded_save(self, sig, data):
        try:
            return save(self, sig, data)
        except OSError as exc:  # read-only or full cache folder: keep the compiled code
            if not _ours(self):
                raise
            _warn_once("save", f"nbgrad: cannot write the compile cache in "
                               f"{self._cache_path} ({exc}); compiled code is not cached")
            return None

    caching.Cache.load_overload = guarded_load
    caching.Cache.save_overload = guarded_save
