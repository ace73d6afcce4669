"""The version of nbgrad (also in pyproject.toml)."""

__version__ = "0.1.0"
