"""The README's worked example: examples/train_mlp.py reaches its stated accuracy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_mlp.py"


def test_train_mlp_example_reaches_the_stated_accuracy():
    # one BLAS thread: the matrices are small, and threads only contend on a busy machine
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                         env=env, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()[-1]
    match = re.search(r"final loss ([\d.]+), train accuracy ([\d.]+)%, "
                      r"test accuracy ([\d.]+)%", last)
    assert match, last
    loss, train_acc, test_acc = (float(g) for g in match.groups())
    assert loss < 0.05
    assert train_acc >= 97.0
    assert test_acc >= 97.0
