"""Exceptions that nbgrad raises on purpose."""


class TableError(ValueError):
    """The derivative table is malformed or disagrees with the registered kernels."""


class TracerError(RuntimeError):
    """A traced function did something that cannot be compiled (e.g. a value-dependent branch)."""


class LinAlgError(RuntimeError):
    """A matrix is singular or not positive definite (``torch.linalg.LinAlgError``)."""
