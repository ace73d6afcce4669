"""Reverse-mode autograd: ``backward``, ``grad``, custom ``Function``s, gradient checks."""

from __future__ import annotations

from ..tensor import install_autograd
from . import function, record  # record installs the recorder into nbgrad.ops.dispatch
from .anomaly import detect_anomaly
from .function import Function, once_differentiable
from .gradcheck import gradcheck, gradgradcheck
from .node import register_retain_grad
from .run import backward, grad

install_autograd(backward, register_retain_grad)

__all__ = ["Function", "backward", "detect_anomaly", "function", "grad", "gradcheck",
           "gradgradcheck", "once_differentiable"]
