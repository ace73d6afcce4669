"""The root folder of an nbgrad clone, imported as ``nbgrad`` by mistake.

Run Python in the folder that holds the clone (``git clone ... nbgrad``) and
``import nbgrad`` finds this folder first: an editable install's finder is asked only
after the current folder, which would give an empty namespace package. This file makes
that import load the package ``import nbgrad`` gives in any other folder (an installed
one), else the clone's own ``./nbgrad/nbgrad``. It is in no installed package
(setup.py lists the packages below ``nbgrad/``); tests/test_packaging.py checks both.
"""

import importlib.machinery as _machinery
import importlib.util as _util
import os as _os
import sys as _sys

_ROOT = _os.path.dirname(_os.path.abspath(__file__))


def _elsewhere():
    """The spec of a regular ``nbgrad`` package found without this folder, or None."""
    parent = _os.path.realpath(_os.path.dirname(_ROOT))
    paths = [p for p in _sys.path if _os.path.realpath(p or _os.curdir) != parent]
    finders = [f for f in _sys.meta_path if hasattr(f, "find_spec")]
    for finder in finders:
        try:
            if finder is _machinery.PathFinder:
                spec = finder.find_spec(__name__, paths)
            else:
                spec = finder.find_spec(__name__, None)
        except Exception:
            continue
        if spec is not None and spec.origin and spec.origin.endswith("__init__.py"):
            return spec
    return None


def _load():
    spec = _elsewhere()
    if spec is None:
        real = _os.path.join(_ROOT, "nbgrad", "__init__.py")
        if not _os.path.isfile(real):
            raise ImportError(f"the folder {_ROOT!r} was imported as 'nbgrad' but holds no "
                              f"package nbgrad/ (run Python from another folder)",
                              name=__name__)
        spec = _util.spec_from_file_location(
            __name__, real, submodule_search_locations=[_os.path.dirname(real)])
    module = _util.module_from_spec(spec)
    _sys.modules[__name__] = module  # what the import statement returns
    try:
        spec.loader.exec_module(module)
    except BaseException:
        _sys.modules.pop(__name__, None)
        raise


if __name__ == "nbgrad":  # inert when a tool imports this folder under its own name
    _load()
