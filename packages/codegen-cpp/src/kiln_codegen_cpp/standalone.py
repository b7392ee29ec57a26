"""What a standalone ``output_code.py`` calls to compile and bind its C++ kernels."""

from __future__ import annotations

import ctypes

import torch

from .codegen import C_SYMBOL
from .compiler import compile_many, kernel_function


def load_kernels(kernels: dict[str, tuple[int, int, str]]) -> dict:
    """``{name: (number of pointer args, number of int64 args, C++ source)}`` -> callables."""
    paths = compile_many({name: src for name, (_, _, src) in kernels.items()})
    threads = torch.get_num_threads()
    out = {}
    for name, (nptr, nint, _) in kernels.items():
        argtypes = [ctypes.c_void_p] * nptr + [ctypes.c_int64] * nint
        out[name] = kernel_function(paths[name], C_SYMBOL, argtypes, threads)
    return out
