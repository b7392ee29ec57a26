"""Zero-size tensors compile and run: index arithmetic over an empty extent (a FloorDiv by a
zero size) must not stop code generation, since those loops never run."""

import pytest
import torch
from cpp_test_utils import check_compile_fx

CASES = {
    "roll_0x0x0": (lambda x: (x.roll(1, 0),), torch.randn(0, 0, 0)),
    "zeros_like_0x3": (lambda x: (torch.zeros_like(x) + x,), torch.randn(0, 3)),
    "full_like_2x0": (lambda x: (torch.full_like(x, 2.0),), torch.randn(2, 0)),
    "sum_over_empty": (lambda x: (x.sum(0),), torch.randn(0, 4)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_zero_size(name):
    check_compile_fx(*CASES[name])
