"""``nbgrad.nn.functional``: activations, losses, normalisation, convolution, pooling.

The functions live in :mod:`nbgrad.ops.nn` and :mod:`nbgrad.ops.conv` (where their
kernels are registered) and :mod:`nbgrad.ops.activations`, :mod:`~nbgrad.ops.normalization`
and :mod:`~nbgrad.ops.attention` (composites of table ops);
this module is their public address.
"""

from ..ops import activations as _activations
from ..ops import attention as _attention
from ..ops import conv as _conv
from ..ops import losses as _losses
from ..ops import nn as _nn
from ..ops import normalization as _normalization
from ..ops import relu, sigmoid, softplus, tanh
from ..ops import resampling as _resampling
from ..ops.activations import *  # noqa: F403
from ..ops.attention import *  # noqa: F403
from ..ops.conv import *  # noqa: F403
from ..ops.losses import *  # noqa: F403
from ..ops.nn import *  # noqa: F403
from ..ops.normalization import *  # noqa: F403
from ..ops.resampling import *  # noqa: F403
from ..ops.resampling import unfold

__all__ = sorted({"relu", "sigmoid", "softplus", "tanh", *_nn.__all__, *_conv.__all__,
                  *_activations.__all__, *_attention.__all__, *_losses.__all__,
                  *_normalization.__all__, *_resampling.__all__,
                  *_resampling.NN_ONLY})
