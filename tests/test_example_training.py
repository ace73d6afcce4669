"""The worked examples reach their stated accuracy: examples/train_mlp.py (the README's,
an ``nn.Sequential`` MLP) and examples/train_cnn.py (a small CNN), both trained with
``nbgrad.optim`` through a jitted loss."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name,max_loss,min_accuracy", [("train_mlp", 0.05, 97.0),
                                                        ("train_cnn", 0.1, 95.0)])
def test_example_reaches_the_stated_accuracy(name, max_loss, min_accuracy):
    # one BLAS thread: the matrices are small, and threads only contend on a busy machine
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], capture_output=True,
                         text=True, env=env, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()[-1]
    match = re.search(r"final loss ([\d.]+), train accuracy ([\d.]+)%, "
                      r"test accuracy ([\d.]+)%", last)
    assert match, last
    loss, train_acc, test_acc = (float(g) for g in match.groups())
    assert loss < max_loss
    assert train_acc >= min_accuracy
    assert test_acc >= min_accuracy
