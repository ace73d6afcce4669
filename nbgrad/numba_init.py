"""Numba's extension entry points, with rocket-fft's deferred until something needs it.

Numba runs every ``numba_extensions`` entry point on its first compile (or disk-cache
load) in a process (:func:`numba.core.entrypoints.init_all`). rocket-fft's imports
``scipy.fft``, about 0.3 s, that a program without FFTs never needs. :func:`install`
(run by ``import nbgrad``) makes that first initialisation, when only nbgrad's own
``@njit`` code is on the stack, load the other extensions and defer :data:`DEFERRED`.
The deferred ones load the first time any other code compiles or loads (a user's
``@njit`` calling ``np.fft``, a ``cfunc``: whatever cannot be told to be nbgrad's), and
nbgrad's FFT ops import rocket-fft themselves before their natives run
(:func:`nbgrad.kernels.fft.require_rocket_fft`). Nothing is deferred if Numba had
initialised its extensions before nbgrad was imported.

Numba's first compile also imports ``numba.np.arraymath``, whose import asks whether
SciPy's BLAS is there by importing ``scipy.linalg.cython_blas``, and so all of
``scipy.linalg`` (0.3-0.5 s). :func:`install` answers that one question by finding the
extension module's file instead (:func:`_blas_present`); ``scipy.linalg`` then loads where
BLAS or LAPACK is used (Numba's own checks at typing, its runtime's first call).
"""

from __future__ import annotations

import sys
import warnings
from importlib import machinery, metadata
from pathlib import Path

import scipy
from numba.core import entrypoints

try:
    from numba.np import linalg as _nb_linalg
except ImportError:  # pragma: no cover - a Numba without it: nothing to defer
    _nb_linalg = None

#: top-level modules of the entry points deferred while only nbgrad's code compiles
DEFERRED = ("rocket_fft",)
#: module prefixes of code that is nbgrad's (its packages and its generated modules)
OWN = ("nbgrad.", "nbgrad_generated")

_ORIGINAL = getattr(entrypoints, "init_all", None)
_STATE = {"deferred": None}  # the entry points not loaded yet (None: partial init not done)


def _load(ep) -> None:
    """Run one entry point as Numba does (a failure warns, as Numba's loader does)."""
    try:
        ep.load()()
    except Exception as e:  # noqa: BLE001 - Numba's own policy for extensions
        warnings.warn(f"Numba extension module '{ep.module}' failed to load due to "
                      f"'{type(e).__name__}({e})'.", stacklevel=3)


def _only_own_code() -> bool:
    """Whether every Numba dispatcher compiling or loading on this stack is nbgrad's
    (False where none is found: an unknown caller gets every extension)."""
    found = False
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith("dispatcher.py"):
            fn = getattr(frame.f_locals.get("self"), "py_func", None)
            if fn is not None:
                mod = getattr(fn, "__module__", None) or ""
                if not (mod + ".").startswith(OWN):
                    return False
                found = True
        frame = frame.f_back
    return found


def _init_all() -> None:
    """Numba's ``init_all`` with :data:`DEFERRED` left out while only nbgrad compiles."""
    deferred = _STATE["deferred"]
    if deferred is None:  # the first initialisation
        if _only_own_code():
            entrypoints._already_initialized = True
            eps = metadata.entry_points().select(group="numba_extensions", name="init")
            _STATE["deferred"] = deferred = []
            for ep in eps:
                if ep.value.split(":")[0].split(".")[0] in DEFERRED:
                    deferred.append(ep)
                else:
                    _load(ep)
            return
        load_deferred(everything=True)
        return
    if deferred and not _only_own_code():
        load_deferred()


def load_deferred(everything: bool = False) -> None:
    """Load the deferred entry points now (``everything``: Numba's whole initialisation,
    where none had run) and give Numba its own ``init_all`` back."""
    entrypoints.init_all = _ORIGINAL
    deferred, _STATE["deferred"] = _STATE["deferred"] or [], []
    if everything:
        _ORIGINAL()
        return
    for ep in deferred:
        _load(ep)


def _blas_present() -> None:
    """Numba's BLAS check without importing ``scipy.linalg``: SciPy's ``cython_blas``
    extension module is installed (ImportError if not, as Numba's check raises), and
    of the integer width Numba was built for."""
    folder = Path(scipy.__file__).parent / "linalg"
    if not any((folder / f"cython_blas{suffix}").is_file()
               for suffix in machinery.EXTENSION_SUFFIXES):
        raise ImportError("scipy.linalg.cython_blas is required for linear algebra")
    _nb_linalg._check_lapack_int_width()


def _ensure_blas_once() -> None:
    """Stands in for ``numba.np.linalg.ensure_blas`` until its first call: the import of
    ``numba.np.arraymath`` (which only asks whether BLAS is there) gets
    :func:`_blas_present`; any other caller gets Numba's own. Numba's is back after it."""
    _nb_linalg.ensure_blas = _ORIGINAL_BLAS
    caller = sys._getframe(1)
    if caller.f_code.co_name == "_check_blas" and \
            caller.f_globals.get("__name__") == "numba.np.arraymath":
        _blas_present()
        return
    _ORIGINAL_BLAS()


_ORIGINAL_BLAS = getattr(_nb_linalg, "ensure_blas", None)


def install() -> None:
    """Once, before Numba's first compile: defer :data:`DEFERRED` and the import of
    ``scipy.linalg`` (see the module docstring). Nothing to do where Numba initialised
    its extensions (or imported ``numba.np.arraymath``) already."""
    if _ORIGINAL_BLAS is not None and "numba.np.arraymath" not in sys.modules and \
            hasattr(_nb_linalg, "_check_lapack_int_width") and \
            _nb_linalg.ensure_blas is _ORIGINAL_BLAS:
        _nb_linalg.ensure_blas = _ensure_blas_once
    if getattr(entrypoints, "_already_initialized", True) or \
            entrypoints.init_all is not _ORIGINAL:
        return  # (also where a Numba without these internals is installed)
    entrypoints.init_all = _init_all
