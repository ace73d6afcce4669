"""Numba's extension entry points: rocket-fft (and its ``scipy.fft``) loads only where an
FFT or code outside nbgrad needs it (:mod:`nbgrad.numba_init`). Fresh processes: the
entry points load once per process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("rocket_fft")

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
    proc = subprocess.run([sys.executable, "-c", SCRIPT, then], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deferred True" in proc.stdout, proc.stdout
    assert "fft True True" in proc.stdout, proc.stdout
