"""Neural-network ops (activations, losses, normalisation) for ``nbgrad.nn.functional``."""

__all__: list[str] = []
