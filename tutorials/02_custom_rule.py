"""
.. _tutorial-custom-rule:

Teach VirtualTensorize a movement op, and read the mapping algebra
==================================================================

Rules are keyed by Relax op name. Here we override the rule of ``relax.flip`` with one written
from scratch (a custom op of your own registers the same way), then compose mappings by hand.
Nothing is compiled: this runs anywhere.

Run it as a script: ``.venv/bin/python tutorials/02_custom_rule.py``.
"""

# %%
# A rule of your own
# ------------------
# A rule takes the normalised ``relax.Call`` and returns a :class:`~vtc_tvm.VirtualTensor`: an
# index map from the output's coordinates to the sources' coordinates, and the sources.

import numpy as np
from tvm import tirx

import vtc_tvm
from vtc_tvm import Mapping, VirtualTensor
from vtc_tvm.rules import dtype_of, get_rule, shape_of


@vtc_tvm.register_rule("relax.flip", override=True)
def flip_rule(call):
    """out[..., i, ...] = x[..., n - 1 - i, ...] along ``axis``."""
    x = call.args[0]
    shape = shape_of(x)
    axis = int(call.attrs.axis) % len(shape)
    return VirtualTensor(
        Mapping.view(shape_of(call), dtype_of(call), shape,
                     lambda *v: [shape[a] - 1 - vi if a == axis else vi for a, vi in enumerate(v)]),
        [x])


assert get_rule("relax.flip") is flip_rule

# %%
# The algebra itself
# ------------------
# ShuffleNet's channel shuffle is reshape -> transpose -> reshape. Composed, the three views are
# ONE map, which a consumer kernel reads through instead of three copies.
N, C, H, W, G = 1, 8, 2, 2, 2
split = Mapping.view((N, G, C // G, H, W), "float32", (N, C, H, W),
                     lambda n, g, c, h, w: (n, g * (C // G) + c, h, w))
swap = Mapping.view((N, C // G, G, H, W), "float32", (N, G, C // G, H, W),
                    lambda n, c, g, h, w: (n, g, c, h, w))
merge = Mapping.view((N, C, H, W), "float32", (N, C // G, G, H, W),
                     lambda n, c, h, w: (n, tirx.floordiv(c, G), tirx.floormod(c, G), h, w))
shuffle = merge.compose(0, swap.compose(0, split))
print(shuffle)  # one piece: src0[n, c % 2 * 4 + c // 2, h, w]

# %%
# Check it against numpy.

x = np.arange(N * C * H * W, dtype="float32").reshape(N, C, H, W)
ref = x.reshape(N, G, C // G, H, W).transpose(0, 2, 1, 3, 4).reshape(N, C, H, W)
assert np.array_equal(shuffle.apply_numpy([x]), ref)
print("composed channel shuffle == numpy")
