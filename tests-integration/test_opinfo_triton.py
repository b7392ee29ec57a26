"""The OpInfo sweep through kiln's Triton codegen under TRITON_INTERPRET=1 (CPU tensors).

Each listed op runs its first float32 CPU OpInfo sample through the FX route (make_fx ->
``kiln_backend(options={"codegen": "triton"})``) and must match eager (assert_close, the
harness's float32 defaults or its documented per-op tolerance) and run as generated Triton:
no aten fallback, no interpreter or eager fallback. The list is every op that did so in a
sweep of the first 400 op_db ops (`TRITON_INTERPRET=1 python tests-integration/opinfo_harness.py
--backends kiln_triton --samples 1 --limit 400`), less those slower than 0.3 s there, so that
this file stays well under 4 minutes on a 2-core machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_codegen_triton  # noqa: F401  (installed with kiln: a broken import fails)
import opinfo_harness as harness  # noqa: E402

TRITON_OPS = [
    '__getitem__', '__radd__', '__rdiv__', '__rmatmul__', '__rmod__', '__rmul__', '__rpow__',
    '__rsub__', '_softmax_backward_data', '_unsafe_masked_index',
    '_unsafe_masked_index_put_accumulate', 'acos', 'acosh', 'add', 'addbmm', 'addcdiv',
    'addcmul', 'addmm', 'addmm.decomposed', 'addmv', 'addr', 'alias_copy', 'angle', 'arange',
    'as_strided', 'as_strided.partial_views', 'as_strided_copy', 'asin', 'asinh', 'atan',
    'atan2', 'atanh', 'atleast_1d', 'atleast_2d', 'atleast_3d', 'baddbmm', 'bfloat16', 'bmm',
    'bool', 'broadcast_shapes', 'broadcast_tensors', 'broadcast_to', 'byte', 'cartesian_prod',
    'ceil', 'char', 'chunk', 'clamp', 'clamp_max', 'clamp_min', 'clone', 'column_stack',
    'conj', 'conj_physical', 'constant_pad_nd', 'contiguous', 'copysign', 'cos', 'cosh',
    'cross', 'cumprod', 'cumsum', 'deg2rad', 'diag', 'diag_embed', 'diagonal', 'diagonal_copy',
    'diagonal_scatter', 'diff', 'dist', 'div.floor_rounding', 'div.no_rounding_mode',
    'div.trunc_rounding', 'dot', 'dsplit', 'einsum', 'eq', 'exp', 'exp2', 'expand',
    'expand_as', 'expand_copy', 'expm1', 'flatten', 'flip', 'fliplr', 'flipud', 'float_power',
    'floor', 'floor_divide', 'fmax', 'fmin', 'fmod', 'frac', 'gather', 'ge', 'gradient', 'gt',
    'heaviside', 'hsplit', 'index_add', 'index_copy', 'index_fill', 'index_put',
    'index_reduce.amax', 'index_reduce.amin', 'index_reduce.mean', 'index_reduce.prod',
    'index_select', 'isclose', 'isfinite', 'isin', 'isinf', 'isnan', 'isneginf', 'isposinf',
    'isreal', 'ldexp', 'le', 'lerp', 'linspace', 'linspace.tensor_overload', 'log', 'log10',
    'log1p', 'log2', 'logaddexp', 'logaddexp2', 'logical_and', 'logical_not', 'logical_or',
    'logical_xor', 'logspace', 'logspace.tensor_overload', 'lt', 'masked_fill', 'matmul',
    'max.binary', 'max.reduction_no_dim', 'maximum', 'meshgrid.list_of_tensors',
    'meshgrid.variadic_tensors', 'min.binary', 'min.reduction_no_dim', 'minimum', 'mm', 'mul',
    'mv', 'mvlgamma.mvlgamma_p_1', 'mvlgamma.mvlgamma_p_3', 'mvlgamma.mvlgamma_p_5',
    'nan_to_num', 'narrow', 'narrow_copy', 'ne', 'neg', 'nn.functional.adaptive_avg_pool1d',
    'nn.functional.adaptive_avg_pool3d', 'nn.functional.binary_cross_entropy_with_logits',
    'nn.functional.celu', 'nn.functional.conv1d', 'nn.functional.conv2d',
    'nn.functional.conv3d', 'nn.functional.conv_transpose1d', 'nn.functional.conv_transpose2d',
    'nn.functional.conv_transpose3d', 'nn.functional.elu', 'nn.functional.gelu',
    'nn.functional.glu', 'nn.functional.hardshrink', 'nn.functional.hardsigmoid',
    'nn.functional.hardswish', 'nn.functional.hardtanh', 'nn.functional.interpolate.linear',
    'nn.functional.interpolate.nearest', 'nn.functional.interpolate.nearest-exact',
    'nn.functional.leaky_relu', 'nn.functional.linear', 'nn.functional.max_unpool1d',
    'nn.functional.max_unpool2d.grad', 'nn.functional.max_unpool3d.grad',
    'nn.functional.multi_margin_loss', 'nn.functional.pad.constant',
    'nn.functional.pad.reflect', 'nn.functional.pad.replicate',
    'nn.functional.pad.replicate_negative', 'nn.functional.prelu', 'nn.functional.relu',
    'nn.functional.relu6', 'nn.functional.rms_norm', 'nn.functional.selu',
    'nn.functional.silu', 'nn.functional.soft_margin_loss', 'nn.functional.softmin',
    'nn.functional.softmin.with_dtype', 'nn.functional.softshrink', 'nn.functional.softsign',
    'nn.functional.tanhshrink', 'nn.functional.threshold', 'nn.functional.unfold', 'outer',
    'permute', 'permute_copy', 'polygamma.polygamma_n_0', 'polygamma.polygamma_n_1',
    'polygamma.polygamma_n_2', 'polygamma.polygamma_n_3', 'polygamma.polygamma_n_4',
    'positive', 'pow', 'rad2deg', 'ravel', 'real', 'reciprocal', 'remainder', 'reshape',
    'reshape_as', 'resolve_conj', 'resolve_neg', 'roll', 'rot90', 'round', 'round.decimals_0',
    'round.decimals_3', 'round.decimals_neg_3', 'rsqrt', 'rsub', 'scatter', 'select',
    'select_scatter', 'sgn', 'sign', 'signbit', 'sin', 'sinc', 'sinh', 'slice', 'softmax',
    'softmax.with_dtype', 'split', 'split.list_args', 'split_with_sizes', 'sqrt', 'square',
    'std_mean', 'std_mean.unbiased', 'sub', 'sum_to_size', 'take', 'tan', 'tanh',
    'tensor_split', 'to', 'true_divide', 'trunc', 'unflatten', 'unsafe_chunk', 'unsafe_split',
    'var_mean', 'var_mean.unbiased', 'vdot', 'view_as', 'view_copy', 'vsplit',
]


@pytest.fixture(scope="module", autouse=True)
def _interpreter(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln-cache")))
    yield
    mp.undo()


@pytest.mark.triton_interpret
@pytest.mark.parametrize("key", TRITON_OPS)
def test_kiln_triton(key):
    result = harness.check_op(harness.find_op(key), ["kiln_triton"], samples=1, timeout=120)
    r = result["backends"]["kiln_triton"]
    assert r["status"] == "pass", (
        f"{key} via kiln_triton: [{r.get('stage')}] {r.get('error')} (raised at {r.get('where')})"
    )
    assert r.get("ran_as_ir"), (
        f"{key} via kiln_triton passed but did not run as generated code: aten fallbacks "
        f"{r.get('aten_fallbacks')}, eager fallbacks {r.get('eager_fallbacks')}, "
        f"interpreter fallbacks {r.get('interpreter_fallbacks')}"
    )


@pytest.mark.triton_interpret
@pytest.mark.parametrize("key", ["item", "allclose", "equal", "cov", "corrcoef",
                                 "sparse.sampled_addmm"])
def test_kiln_triton_via_frontend(key):
    """Ops make_fx cannot trace pass through the frontend (test_opinfo_fast.py)."""
    from test_opinfo_fast import check_via_frontend

    check_via_frontend(key, "kiln_triton")
