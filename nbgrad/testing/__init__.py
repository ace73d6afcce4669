"""Op records: sample inputs and references for every table entry.

One :class:`OpRecord` per entry of ``formulas/derivatives.yaml`` drives the generated
tests (forward against NumPy/SciPy, gradcheck and gradgradcheck, eager and jit) and
``nbgrad check``. Records live in :mod:`nbgrad.testing.records`, one module per area.
"""

from .core import (
    DOMAINS,
    OpRecord,
    Sample,
    all_records,
    binary_samples,
    float_tensor_call,
    make_inputs,
    sample_array,
    unary_samples,
)

__all__ = ["DOMAINS", "OpRecord", "Sample", "all_records", "binary_samples",
           "float_tensor_call", "make_inputs", "sample_array", "unary_samples"]
