"""Convolution and pooling ops for ``nbgrad.nn.functional``."""

__all__: list[str] = []
