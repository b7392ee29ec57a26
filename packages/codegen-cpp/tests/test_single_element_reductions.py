"""Index reductions over one element (a 0-dim input, or size-1 reduced dims) give index 0,
through the full pipeline (aotgrad -> loopir -> C++), as eager does."""

import pytest
import torch
from cpp_test_utils import check_compile_fx

CASES = {
    "argmax_0dim": (lambda x: x.argmax(), torch.tensor(-8.478)),
    "argmin_0dim": (lambda x: x.argmin(), torch.tensor(3.5)),
    "argmax_size1_dim": (lambda x: x.argmax(1), torch.randn(4, 1)),
    "max_dim_0dim": (lambda x: torch.max(x, 0), torch.tensor(-2.0)),
    "min_dim_keepdim_size1": (lambda x: torch.min(x, 1, keepdim=True), torch.randn(3, 1, 2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_index_reduction_over_one_element(name):
    check_compile_fx(*CASES[name])
