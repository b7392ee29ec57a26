"""The CUDA attention rule (``decompositions._sdpa_on_cuda``): it asks torch which backend the
traced tensors get without putting that question into the graph (a ``_fused_sdp_choice`` node
has no lowering: the whole graph ran eagerly), and it leaves CPU attention to torch. Its CUDA
behaviour is tested on a GPU (packages/kiln/tests/test_attention_cuda.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kiln_aotgrad import core_decompositions
from kiln_aotgrad.decompositions import _sdpa_on_cuda, _traced_choice_is_math, function_rules
from torch.fx.experimental.proxy_tensor import make_fx


@pytest.mark.parametrize("tracing_mode", ["real", "fake"])
def test_the_backend_question_is_not_part_of_the_graph(tracing_mode):
    answers = []

    def f(q, k, v, m):
        with function_rules():
            answers.append(_traced_choice_is_math(q, k, v, m, 0.0, False, None, False))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    q = torch.randn(2, 4, 16, 8)
    m = torch.ones(2, 1, 16, 16, dtype=torch.bool)
    gm = make_fx(f, decomposition_table=core_decompositions(), tracing_mode=tracing_mode)(q, q, q, m)
    assert answers and all(isinstance(a, bool) for a in answers)
    assert not [n for n in gm.graph.nodes if "fused_sdp_choice" in str(n.target)], gm.code


def test_cpu_attention_is_left_to_torch():
    q = torch.randn(2, 4, 16, 8)
    assert _sdpa_on_cuda(q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.bool)) is NotImplemented
