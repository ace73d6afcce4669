"""Devices: ``"cpu"`` and ``"cuda"`` (``"cuda:0"``)."""

from __future__ import annotations


class Device:
    """A device a tensor lives on; compares equal to its name (``Device("cpu") == "cpu"``)."""

    __slots__ = ("type", "index")

    def __init__(self, type: str, index: int | None = None) -> None:  # noqa: A002
        self.type = type
        self.index = index

    @staticmethod
    def of(spec: object) -> Device:
        if isinstance(spec, Device):
            return spec
        if spec is None:
            return cpu_device
        text = str(spec)
        name, _, idx = text.partition(":")
        if name not in ("cpu", "cuda"):
            raise RuntimeError(f"unknown device {text!r}; use 'cpu' or 'cuda'")
        if name == "cpu":
            return cpu_device
        index = int(idx) if idx else 0
        device = _CUDA_DEVICES.get(index)
        if device is None:  # one object per device, so that identity checks are quick
            device = _CUDA_DEVICES[index] = Device("cuda", index)
        return device

    def __str__(self) -> str:
        if self.type == "cuda" and self.index:
            return f"cuda:{self.index}"
        return self.type

    def __repr__(self) -> str:
        return f"device(type='{self.type}')" if self.index is None else \
            f"device(type='{self.type}', index={self.index})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (str, Device)):
            try:
                other = Device.of(other)
            except RuntimeError:
                return False
            return self.type == other.type and (self.index or 0) == (other.index or 0)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.type, self.index or 0))


cpu_device = Device("cpu")
_CUDA_DEVICES: dict[int, Device] = {}
