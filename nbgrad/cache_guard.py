"""Make Numba's on-disk cache of nbgrad's kernels fail safe, and never trust a folder
that another user can write to.

Numba raises when a cache index or data file is truncated or corrupt, and when a
cache folder is read-only at save time. For files that belong to nbgrad (its
package folder and its cache folder) this guard turns both into a recompile (or an
unsaved result) and one warning; every other Numba cache behaves as before.
Caches of an older nbgrad or Numba never meet newer code: the cache folder is keyed by
both versions, and Numba's index is keyed by the source file's stamp.

Numba's cache files are pickles (loading one runs code), so they are read only from a
folder that :func:`tree_problem` finds safe: owned by this user (or root) and not
writable by anyone else, up to the root folder. :mod:`nbgrad.codegen` applies the same
check to the folder of nbgrad's generated modules.
"""

from __future__ import annotations

import os
import stat
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from numba.core import caching
from numba.core.cpu import CPUContext
from numba.core.runtime.nrt import rtsys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_WARNED: set[str] = set()


def _no_roots() -> tuple[Path, ...]:
    return ()


#: the folders of nbgrad's generated modules; nbgrad.codegen installs its cache_roots
_cache_roots: Callable[[], tuple[Path, ...]] = _no_roots


def set_cache_roots(roots: Callable[[], tuple[Path, ...]]) -> None:
    """Called by :mod:`nbgrad.codegen` at import: where generated modules live."""
    global _cache_roots
    _cache_roots = roots


# ------------------------------------------------------------------ folder trust
def tree_problem(path: str | os.PathLike, mine: str | os.PathLike | None = None) -> str | None:
    """Why another user could change ``path`` (a file or folder), or None if no one can.

    Every existing component from ``/`` down to ``path`` (symbolic links resolved) must
    belong to this user or root (to this user alone at and below ``mine``) and must not
    be writable by its group or by others; a sticky folder (``/tmp``)
    is accepted above ``mine``. (A private folder above does not excuse a writable one
    below it: bind mounts and open handles reach past it.) Not checked on Windows.
    """
    if not hasattr(os, "geteuid"):
        return None
    real = Path(os.path.realpath(path))
    own_from = Path(os.path.realpath(mine)) if mine is not None else None
    for p in [*reversed(real.parents), real]:
        problem = _component_problem(p, own_from, leaf=p == real)
        if problem is not None:
            return problem or None  # "": missing, nothing there to load (yet)
    return None


def _component_problem(p: Path, own_from: Path | None, leaf: bool) -> str | None:
    """The problem of one path component, "" if it does not exist, None if it is safe."""
    euid = os.geteuid()
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"{p} cannot be checked ({exc})"
    own = own_from is not None and (p == own_from or own_from in p.parents)
    if st.st_uid != euid and (own or st.st_uid != 0):
        return f"{p} belongs to another user (uid {st.st_uid}, this process runs as uid {euid})"
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and not leaf and not own
    mode = oct(stat.S_IMODE(st.st_mode))
    if st.st_mode & stat.S_IWOTH and not sticky:
        return f"{p} is writable by every user (mode {mode})"
    if st.st_mode & stat.S_IWGRP and not sticky:
        return f"{p} is writable by its group (gid {st.st_gid}, mode {mode})"
    return None


_SAFE_FOLDERS: set[tuple] = set()


def _files_problem(folder: str, files: list[str], mine: Path | None) -> str | None:
    """:func:`tree_problem` of ``folder`` (remembered once safe: only its owner or root can
    change that), then of each file in it."""
    if not hasattr(os, "geteuid"):
        return None
    key = (folder, mine, os.geteuid())
    if key not in _SAFE_FOLDERS:
        problem = tree_problem(folder, mine)
        if problem:
            return problem
        _SAFE_FOLDERS.add(key)
    own_from = Path(os.path.realpath(mine)) if mine is not None else None
    for f in files:
        problem = _component_problem(Path(os.path.realpath(f)), own_from, leaf=True)
        if problem:
            return problem
    return None


def make_private_dirs(path: Path) -> None:
    """``mkdir -p`` with mode 0700 for every folder it creates."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass


# ------------------------------------------------------------------ Numba's cache
def _source_file(cache) -> str:
    func = getattr(cache, "_py_func", None)
    code = getattr(func, "__code__", None)
    return getattr(code, "co_filename", "") or ""


def _ours(cache) -> bool:
    """Whether ``cache`` holds one of nbgrad's functions (package or generated code)."""
    roots = (_PACKAGE_DIR, *map(str, _cache_roots()))
    return any(p.startswith(root + os.sep) or p == root for p in
               (_source_file(cache), getattr(cache, "_cache_path", "") or "") for root in roots)


def _warn_once(kind: str, message: str) -> None:
    if kind not in _WARNED:
        _WARNED.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _cache_files(cache) -> list[str]:
    """The index file and the data files of one cached function."""
    index = cache._cache_file._index_path
    folder, name = os.path.split(index)
    stem = name[:-len("nbi")]
    try:
        with os.scandir(folder) as entries:
            data = [e.path for e in entries
                    if e.name.startswith(stem) and e.name.endswith(".nbc")]
    except OSError:
        data = []
    return [index, *data]


def _data_files(cache) -> list[str]:
    """The data files the index of ``cache`` names (the index passed the check: reading
    it is what Numba does next), or, where Numba's index cannot be read so, every file of
    the function (a listing of the folder, which holds every cached function's files)."""
    try:
        index = cache._cache_file
        return [index._data_path(name) for name in index._load_index().values()]
    except Exception:  # noqa: BLE001 - a damaged index (the load then reports it) or an API change
        return _cache_files(cache)[1:]


def _unsafe(cache) -> bool:
    """Whether Numba's cache files of ``cache`` could have been written by another user
    (then they are neither read nor written: loading a pickle runs code). The index is
    checked first, then the data files it names."""
    folder = cache._cache_path
    mine = next((r for r in _cache_roots() if folder.startswith(str(r) + os.sep)), None)
    problem = _files_problem(folder, [cache._cache_file._index_path], mine) or \
        _files_problem(folder, _data_files(cache), mine)
    if problem:
        _warn_once("unsafe", f"nbgrad: not using Numba's compile cache in {folder}: "
                             f"{problem}; compiling instead (make the folder private "
                             f"to this user, e.g. chmod go-w, to cache again)")
    return bool(problem)


def _private_files(cache) -> None:
    """Take group/other write off the files Numba just wrote (it honours the umask only)."""
    for path in _cache_files(cache):
        try:
            mode = os.stat(path).st_mode
            if mode & 0o022:
                os.chmod(path, stat.S_IMODE(mode) & ~0o022)
        except OSError:
            pass


def _drop_damaged(cache) -> None:
    """Remove the index and data files of one cached function."""
    for path in _cache_files(cache):
        try:
            os.unlink(path)
        except OSError:
            pass


def _load_without_refresh(cache, sig, target_context):
    """Numba's ``Cache.load_overload`` less its ``target_context.refresh()``, for the CPU
    target: the refresh imports and installs every lowering and typing registry (Numba's
    NumPy, random, linalg, typed containers...: 100-150 ms, the bulk of a process's first
    kernel load), which only compiling needs, and every compile refreshes first
    (``CompilerBase``). Loading needs the runtime (NRT) initialised, as the refresh would
    have done; the rest of a load (the code, its environments, its ``reload_init``) is
    Numba's own ``_load_overload``."""
    rtsys.initialize(target_context)
    with cache._guard_against_spurious_io_errors():
        return cache._load_overload(sig, target_context)


#: whether nbgrad's kernels load from Numba's CPU cache without the context's refresh
#: (:func:`_load_without_refresh`; False: Numba's own ``load_overload``)
LOAD_WITHOUT_REFRESH = True


def _guard(cache_class) -> None:
    """Wrap ``load_overload`` / ``save_overload`` of one Numba ``Cache`` class (once)."""
    if cache_class.__dict__.get("_nbgrad_guarded"):
        return
    load, save = cache_class.load_overload, cache_class.save_overload
    cpu = cache_class is caching.Cache and all(
        hasattr(cache_class, a) for a in ("_load_overload", "_guard_against_spurious_io_errors"))

    def guarded_load(self, sig, target_context):
        ours = _ours(self)
        if ours and _unsafe(self):
            return None
        try:
            if ours and cpu and LOAD_WITHOUT_REFRESH and isinstance(target_context, CPUContext):
                return _load_without_refresh(self, sig, target_context)
            return load(self, sig, target_context)
        except Exception as exc:  # a damaged cache entry: recompile
            if not ours:
                raise
            _warn_once("load", f"nbgrad: the compile cache in {self._cache_path} was damaged "
                               f"({type(exc).__name__}: {exc}); recompiling")
            _drop_damaged(self)
            return None

    def guarded_save(self, sig, data):
        ours = _ours(self)
        if ours and _unsafe(self):  # saving reads the index (a pickle) first
            return None
        try:
            save(self, sig, data)
            if ours:
                _private_files(self)
            return None
        except OSError as exc:  # read-only or full cache folder: keep the compiled code
            if not ours:
                raise
            _warn_once("save", f"nbgrad: cannot write the compile cache in "
                               f"{self._cache_path} ({exc}); compiled code is not cached")
            return None

    cache_class.load_overload = guarded_load
    cache_class.save_overload = guarded_save
    cache_class._nbgrad_guarded = True


def install() -> None:
    """Guard Numba's CPU cache, and numba-cuda's once ``numba.cuda`` is imported
    (call again after importing it; each class is wrapped once)."""
    _guard(caching.Cache)
    cuda_caching = sys.modules.get("numba.cuda.core.caching")
    if cuda_caching is not None:
        _guard(cuda_caching.Cache)
