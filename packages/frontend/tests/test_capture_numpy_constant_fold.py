"""A NumPy function on constants (``np.sqrt(d_model)``) is the NumPy scalar NumPy returns, so a
tensor scaled by it stays a tensor: it was a 0-d array node, ``x *= np.sqrt(16)`` made ``x``
an ndarray and transformers' CTRL failed on ``x.to(dtype=x.dtype)``
(benchmarks/model_sweep.py)."""

from __future__ import annotations

import numpy as np
import torch
from _counting_backend import one_graph


def scale_in_place(x):
    y = x + 1
    y *= np.sqrt(16)
    return y.to(dtype=y.dtype) + np.float32(np.log(2.0))


def test_numpy_function_on_constants_keeps_tensors_tensors():
    gm = one_graph(scale_in_place, torch.randn(3, 4))
    assert not any("numpy" in str(n.target) for n in gm.graph.nodes)
