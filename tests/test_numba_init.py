"""Numba's extension entry points: rocket-fft (and its ``scipy.fft``) loads only where an
FFT or code outside nbgrad needs it, and ``scipy.linalg`` only where BLAS or LAPACK is
used (:mod:`nbgrad.numba_init`). Fresh processes: these load once per process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import nbgrad as nb
    from numba import njit

    x = nb.tensor(np.linspace(-1.0, 1.0, 7))
    y = float((nb.sin(x) * 2.0).sum())  # nbgrad's kernels load or compile
    print("deferred", "scipy.fft" not in sys.modules and "rocket_fft" not in sys.modules)
    if sys.argv[1] == "fft":  # nbgrad.fft still works in the same process
        import nbgrad.fft as F
        z = np.asarray(F.rfft(nb.tensor(np.arange(8.0)))._pairs._data)
        ok = np.allclose(z[..., 0] + 1j * z[..., 1], np.fft.rfft(np.arange(8.0)))
    else:  # so does a user's @njit calling np.fft (rocket-fft through its entry point)
        f = njit(lambda a: np.fft.fft(a))
        ok = np.allclose(f(np.arange(4.0)), np.fft.fft(np.arange(4.0)))
    print("fft", ok, np.isclose(y, 2.0 * np.sin(np.linspace(-1.0, 1.0, 7)).sum()))
""")


@pytest.mark.parametrize("then", ["fft", "user"])
def test_rocket_fft_waits_for_an_fft(then):
    pytest.importorskip("rocket_fft")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, then], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deferred True" in proc.stdout, proc.stdout
    assert "fft True True" in proc.stdout, proc.stdout


BLAS_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import nbgrad as nb
    from numba import njit

    x = nb.tensor(np.linspace(-1.0, 1.0, 7), requires_grad=True)
    (nb.sin(x) * x).sum().backward()  # nbgrad's kernels load or compile
    njit(lambda v: v + 1.0)(1.0)  # a compile: Numba's registries (arraymath...) load
    print("deferred", "scipy.linalg" not in sys.modules, "numba.np.arraymath" in sys.modules)
    a = np.arange(6.0).reshape(2, 3)
    ok_user = np.allclose(njit(lambda u, v: np.dot(u, v))(a, a.T), a @ a.T)  # a user's BLAS
    m = nb.tensor(a, requires_grad=True)
    (m @ m.T).sum().backward()  # nbgrad's own
    print("blas", ok_user, np.allclose(m.grad.numpy(), 2 * a.sum(0) * np.ones_like(a)),
          "scipy.linalg" in sys.modules)
""")


def test_scipy_linalg_waits_for_blas():
    """Numba's import of numba.np.arraymath (at its first compile; loading nbgrad's
    cached kernels does not import it) no longer imports all
    of scipy.linalg to ask whether BLAS is there; BLAS still works for a user's @njit and
    for nbgrad's matmul afterwards."""
    proc = subprocess.run([sys.executable, "-c", BLAS_SCRIPT], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deferred True True" in proc.stdout, proc.stdout
    assert "blas True True True" in proc.stdout, proc.stdout
