"""C++ kernels for hand-built schedules, checked against eager torch and the loopir interpreter."""

import math

import pytest
import sympy
import torch
from cpp_test_utils import G, check, compile_sched
from kiln_codegen_cpp import CppKernel
from kiln_codegen_cpp.compiler import vectorized_loops
from kiln_loopir.ops_spec import OPS, missing_ops
from kiln_loopir.virtualized import MissingOpError, ops

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I32, I64, BOOL = torch.int32, torch.int64, torch.bool
HALF = (F16, BF16)


def _f(v, dtype):
    """to float32 compute for half types (lowering's convention)."""
    return ops.to_dtype(v, F32) if dtype in HALF else v


def _back(v, dtype):
    return ops.to_dtype(v, dtype) if dtype in HALF else v


# ---------------------------------------------------------------------------------------------
# the seed: cos(x) + sin(y)
# ---------------------------------------------------------------------------------------------


def seed_schedule(x, y, dynamic=False):
    g = G(x, y, dynamic=dynamic)
    size = [g.size(n) for n in x.shape]
    out = g.pointwise(size, lambda i: ops.add(ops.cos(g.load(0, i)), ops.sin(g.load(1, i))), F32)
    return g.schedule([out])


def test_seed_one_kernel_one_load_per_input_one_store_vectorized():
    x, y = torch.randn(8, 100), torch.randn(8, 100)
    fn = check(seed_schedule(x, y, dynamic=True), [x, y], [x.cos() + y.sin()])
    (kernel,) = fn.module.kernels
    assert kernel.meta["loads"] == 2 and kernel.meta["stores"] == 1
    body = kernel.meta["body"]
    assert body.count("in_ptr0[") == 1 and body.count("in_ptr1[") == 1 and body.count("out_ptr0[") == 1
    lines = [ln.strip() for ln in body.splitlines()]
    fors = [k for k, ln in enumerate(lines) if ln.startswith("for (")]
    assert len(fors) == 1  # [s0, s1] contiguous: one loop over s0*s1 elements
    (innermost,) = fors
    assert lines[innermost] == "for (int64_t i0 = 0; i0 < xnumel; i0++)"
    # parallel over threads (when there is enough work), SIMD inside each thread's chunk
    assert lines[innermost - 1] == ("#pragma omp parallel for simd num_threads(kiln_num_threads) "
                                    "if(xnumel >= 16384)")
    assert "in_ptr0[i0]" in body and "out_ptr0[i0] = " in body
    # GCC really vectorizes the innermost loop
    assert lines[innermost] in vectorized_loops(kernel.source)
    # the wrapper calls exactly one kernel and allocates one buffer
    src = fn.module.wrapper_source
    assert src.count("cpp_kernel_") == 1 and src.count("empty_strided_cpu(") == 1
    # the wrapper reads each size once and computes the element count for the kernel
    assert "    s0 = arg0.size(0)\n    s1 = arg0.size(1)\n" in src
    assert "    xnumel = s0*s1\n    cpp_kernel_0(buf0.data_ptr(), arg0.data_ptr(), arg1.data_ptr(), xnumel)\n" in src


def test_seed_dynamic_two_shapes_one_kernel():
    x, y = torch.randn(4, 9), torch.randn(4, 9)
    fn = check(seed_schedule(x, y, dynamic=True), [x, y], [x.cos() + y.sin()])
    for shape in [(3, 1000), (17, 33), (1, 5)]:
        a, b = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(fn(a, b)[0], a.cos() + b.sin())


def test_non_contiguous_input():
    x = torch.randn(40, 30).t()  # stride (1, 30)
    y = torch.randn(30, 40)[:, ::1]
    g = G(x, y)
    out = g.pointwise([30, 40], lambda i: ops.mul(g.load(0, i), g.load(1, i)), F32)
    check(g.schedule([out]), [x, y], [x * y])


# ---------------------------------------------------------------------------------------------
# pointwise chains, broadcasting, dtypes
# ---------------------------------------------------------------------------------------------


def test_pointwise_chain_with_broadcast():
    x, b = torch.randn(5, 7, 33), torch.randn(33)
    g = G(x, b, dynamic=True)
    S = [g.size(5), g.size(7), g.size(33)]

    def fn(i):
        v = ops.add(g.load(0, i), g.load(1, [i[2]]))
        v = ops.mul(v, ops.sigmoid(v))
        v = ops.where(ops.gt(v, ops.constant(0.5, F32)), ops.tanh(v), ops.exp(ops.neg(v)))
        return ops.maximum(v, ops.constant(-0.25, F32))

    out = g.pointwise(S, fn, F32)
    v = x + b
    v = v * torch.sigmoid(v)
    v = torch.where(v > 0.5, v.tanh(), (-v).exp())
    check(g.schedule([out]), [x, b], [torch.maximum(v, torch.tensor(-0.25))])


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64])
def test_float_dtypes_roundtrip(dtype):
    x = (torch.randn(6, 50) * 3).to(dtype)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 65504.0]).to(dtype)
    g = G(x)

    def fn(i):
        v = _f(g.load(0, i), dtype)
        return _back(ops.add(ops.mul(v, ops.constant(1.5, v_dtype(dtype))), ops.constant(0.1, v_dtype(dtype))), dtype)

    out = g.pointwise([6, 50], fn, dtype)
    expected = (x.to(v_dtype(dtype)) * 1.5 + 0.1).to(dtype)
    check(g.schedule([out]), [x], [expected], equal_nan=True)


def v_dtype(dtype):
    return F32 if dtype in HALF else dtype


def test_half_conversion_is_exact_for_every_bit_pattern():
    bits = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16)
    for dtype in HALF:
        x = bits.view(dtype)
        g = G(x)
        # to float, back to half, and float -> half rounding of values between halves
        out_f = g.pointwise([65536], lambda i, g=g: ops.to_dtype(g.load(0, i), F32), F32)
        out_h = g.pointwise([65536], lambda i, g=g, d=dtype: ops.to_dtype(ops.to_dtype(g.load(0, i), F32), d), dtype)
        fn = compile_sched(g.schedule([out_f, out_h]))
        f, h = fn(x)
        torch.testing.assert_close(f, x.float(), equal_nan=True, rtol=0, atol=0)
        same = (h.view(torch.int16) == x.view(torch.int16)) | torch.isnan(x)
        assert bool(same.all())
    y = torch.randn(100000) * 1000
    for dtype in HALF:
        g = G(y)
        out = g.pointwise([100000], lambda i, g=g, d=dtype: ops.to_dtype(g.load(0, i), d), dtype)
        (h,) = compile_sched(g.schedule([out]))(y)
        assert torch.equal(h.view(torch.int16), y.to(dtype).view(torch.int16))


def test_integer_semantics():
    a = torch.tensor([7, -7, 7, -7, 0, 5, -128, 100], dtype=I32).repeat(5)
    b = torch.tensor([2, 2, -2, -2, 3, 1, 3, 7], dtype=I32).repeat(5)
    g = G(a, b)
    n = [a.numel()]
    outs = [
        g.pointwise(n, lambda i: ops.floordiv(g.load(0, i), g.load(1, i)), I32),
        g.pointwise(n, lambda i: ops.truncdiv(g.load(0, i), g.load(1, i)), I32),
        g.pointwise(n, lambda i: ops.remainder(g.load(0, i), g.load(1, i)), I32),
        g.pointwise(n, lambda i: ops.fmod(g.load(0, i), g.load(1, i)), I32),
        g.pointwise(n, lambda i: ops.bitwise_xor(g.load(0, i), g.load(1, i)), I32),
        g.pointwise(n, lambda i: ops.bitwise_left_shift(g.load(0, i), ops.abs(g.load(1, i))), I32),
        g.pointwise(n, lambda i: ops.bitwise_right_shift(g.load(0, i), ops.abs(g.load(1, i))), I32),
        g.pointwise(n, lambda i: ops.to_dtype(ops.mul(g.load(0, i), g.load(1, i)), I64), I64),
        g.pointwise(n, lambda i: ops.logical_and(ops.lt(g.load(0, i), g.load(1, i)),
                                                 ops.ne(g.load(0, i), ops.constant(0, I32))), BOOL),
        g.pointwise(n, lambda i: ops.pow(g.load(1, i), ops.constant(3, I32)), I32),
        g.pointwise(n, lambda i: ops.sign(g.load(0, i)), I32),
        g.pointwise(n, lambda i: ops.to_dtype(ops.index_expr(i[0], I64), I64), I64),
    ]
    expected = [
        torch.div(a, b, rounding_mode="floor"), torch.div(a, b, rounding_mode="trunc"),
        torch.remainder(a, b), torch.fmod(a, b), a ^ b, a << b.abs(), a >> b.abs(),
        (a * b).long(), (a < b) & (a != 0), b**3, a.sign(), torch.arange(a.numel()),
    ]
    check(g.schedule(outs), [a, b], expected)


def test_bool_and_casts():
    x = torch.randn(64) * 3
    x[:3] = torch.tensor([float("nan"), 0.0, -0.0])
    m = torch.rand(64) > 0.5
    g = G(x, m)
    n = [64]
    outs = [
        g.pointwise(n, lambda i: ops.to_dtype(g.load(0, i), BOOL), BOOL),
        g.pointwise(n, lambda i: ops.to_dtype(g.load(0, i), I32), I32),
        g.pointwise(n, lambda i: ops.to_dtype(g.load(1, i), F32), F32),
        g.pointwise(n, lambda i: ops.logical_xor(g.load(1, i), ops.isnan(g.load(0, i))), BOOL),
        g.pointwise(n, lambda i: ops.where(g.load(1, i), g.load(0, i), ops.constant(float("-inf"), F32)), F32),
        g.pointwise(n, lambda i: ops.bitwise_not(g.load(1, i)), BOOL),
        g.pointwise(n, lambda i: ops.to_dtype(ops.to_dtype(g.load(0, i), I64), torch.uint8), torch.uint8),
    ]
    finite = ~x.isnan()
    expected = [x.bool(), x.to(I32), m.float(), m ^ x.isnan(),
                torch.where(m, x, -math.inf), ~m, x.long().to(torch.uint8)]
    # float -> int of NaN is undefined (x86 gives INT_MIN, as eager does here)
    expected[1] = torch.where(finite, expected[1], torch.tensor(-(2**31), dtype=I32))
    check(g.schedule(outs), [x, m], expected, equal_nan=True)


UNARY_FLOAT = ["abs", "neg", "reciprocal", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2",
               "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
               "asinh", "acosh", "atanh", "sigmoid", "erf", "erfc", "erfinv", "lgamma", "sign",
               "floor", "ceil", "round", "trunc", "relu"]
BOOL_UNARY = ["signbit", "isnan", "isinf", "isfinite"]
BINARY_FLOAT = ["add", "sub", "mul", "truediv", "floordiv", "truncdiv", "remainder", "fmod", "pow",
                "atan2", "hypot", "copysign", "maximum", "minimum"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


def _domain(name, x):
    if name in ("acosh",):
        return x.abs() + 1
    if name in ("asin", "acos", "atanh", "erfinv"):
        return torch.tanh(x) * 0.99
    if name in ("log", "log2", "log10", "sqrt", "rsqrt", "lgamma"):
        return x.abs() + 0.01
    if name == "log1p":
        return x.abs()
    return x


@pytest.mark.parametrize("dtype", [F32, F64])
def test_every_math_op_matches_its_reference(dtype):
    """One kernel with a node per op of ops_spec, each checked against the spec's ref."""
    torch.manual_seed(0)
    x = (torch.randn(4, 40) * 2).to(dtype)
    y = (torch.randn(4, 40) * 2).to(dtype)
    y[0, :3] = torch.tensor([0.5, -0.5, 2.5], dtype=dtype)  # round half to even
    x[1, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 2.5], dtype=dtype)
    inputs = {name: _domain(name, x) for name in UNARY_FLOAT + BOOL_UNARY}
    ins = list(inputs.values()) + [x, y]
    g = G(*ins)
    outs, expected = [], []
    for k, name in enumerate(inputs):
        od = BOOL if name in BOOL_UNARY else dtype
        outs.append(g.pointwise([4, 40], lambda i, k=k, name=name: getattr(ops, name)(g.load(k, i)), od))
        expected.append(OPS[name].ref(inputs[name]))
    nx = len(inputs)
    for name in BINARY_FLOAT + COMPARE:
        od = BOOL if name in COMPARE else dtype
        outs.append(g.pointwise([4, 40], lambda i, name=name: getattr(ops, name)(g.load(nx, i), g.load(nx + 1, i)), od))
        expected.append(OPS[name].ref(x, y))
    fn = compile_sched(g.schedule(outs))
    got = fn(*ins)
    names = list(inputs) + BINARY_FLOAT + COMPARE
    for name, a, e in zip(names, got, expected, strict=True):
        tol = dict(rtol=2e-5, atol=1e-5) if dtype == F32 else dict(rtol=1e-7, atol=1e-7)
        torch.testing.assert_close(a, e, equal_nan=True, **tol, msg=lambda m, name=name: f"{name}: {m}")


def test_handler_implements_every_op():
    """Every op of the spec is a method of the class (a spelling of CppOps' table or a memory
    op of the kernel): the CLikeOpsHandler base refuses a class that lacks one."""
    assert missing_ops(CppKernel) == []
    k = CppKernel.__new__(CppKernel)
    for name in OPS:
        assert callable(getattr(k, name)), name


def test_missing_op_fails_loudly_with_its_name():
    x = torch.randn(8)
    g = G(x)
    out = g.pointwise([8], lambda i: ops.frobnicate(g.load(0, i)), F32)
    with pytest.raises(MissingOpError, match="frobnicate"):
        compile_sched(g.schedule([out]))


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------

REDUCTIONS = {
    "sum": lambda t, d: t.sum(d),
    "prod": lambda t, d: t.prod(d),
    "max": lambda t, d: t.amax(d),
    "min": lambda t, d: t.amin(d),
    "argmax": lambda t, d: t.argmax(d),
    "argmin": lambda t, d: t.argmin(d),
}


@pytest.mark.parametrize("rtype", list(REDUCTIONS))
def test_reductions_last_dim(rtype):
    x = torch.randn(9, 70)
    if rtype == "prod":
        x = 1 + x * 0.01
    x[2, 5] = float("nan")
    x[3, :] = 1.0  # ties: first index wins
    x[4, 40] = x[4, 3] = 100.0
    g = G(x, dynamic=True)
    R, N = g.size(9), g.size(70)
    out_dtype = I64 if rtype.startswith("arg") else F32
    out = g.reduction([R], [N], rtype, lambda i, r: g.load(0, [i[0], r[0]]), out_dtype, F32)
    fn = check(g.schedule([out]), [x], [REDUCTIONS[rtype](x, 1)], equal_nan=True)
    y = torch.randn(3, 5)  # shorter than the lane width: tail only
    torch.testing.assert_close(fn(y)[0], REDUCTIONS[rtype](y, 1))


@pytest.mark.parametrize("rtype", ["sum", "max", "argmin"])
def test_reductions_non_last_dim(rtype):
    x = torch.randn(50, 6, 20)
    g = G(x)
    out_dtype = I64 if rtype.startswith("arg") else F32
    # reduce dim 1 and 0 of a [50, 6, 20] tensor -> [20]
    out = g.reduction([20], [50, 6], rtype, lambda i, r: g.load(0, [r[0], r[1], i[0]]), out_dtype, F32)
    expected = REDUCTIONS[rtype](x.permute(2, 0, 1).reshape(20, 300), 1)
    fn = check(g.schedule([out]), [x], [expected])
    # memory is contiguous along the output dim: 16 outputs are reduced together (lane mode)
    body = fn.module.kernels[0].meta["body"]
    assert "16 lanes of i0" in body
    assert "for (int64_t l = 0; l < 16; l++)" in vectorized_loops(fn.module.kernels[0].source)


def test_full_reduction_to_scalar():
    x = torch.randn(1000, 37)
    g = G(x)
    out = g.reduction([], [1000, 37], "sum", lambda i, r: g.load(0, [r[0], r[1]]), F32)
    check(g.schedule([out]), [x], [x.sum()], rtol=1e-5, atol=1e-4)


def test_parallel_full_reductions_one_dim_dynamic():
    """No outer loop: the threads split the reduction (per-thread partials, then a scalar
    tail); dynamic size, a tail that is not a multiple of the lane count, NaN and ties."""
    x = torch.randn(100003)
    x[70000] = x[90000] = 50.0  # a tie across threads: the first index wins
    g = G(x, dynamic=True)
    n = g.size(100003)
    outs = [g.reduction([], [n], rtype, lambda i, r: g.load(0, [r[0]]), I64 if rtype.startswith("arg") else F32, F32)
            for rtype in ["sum", "max", "argmax", "argmin"]]
    fn = check(g.schedule(outs), [x], [x.sum(), x.max(), x.argmax(), x.argmin()], rtol=1e-4, atol=1e-3)
    assert "threads split the reduction" in fn.module.kernels[0].meta["body"]
    y = torch.randn(50001)
    y[7] = float("nan")
    y[40000] = float("nan")
    s, m, am, an = fn(y)
    assert torch.isnan(s) and torch.isnan(m) and am.item() == 7 and an.item() == 7
    z = torch.randn(5)  # below the parallel threshold at run time
    torch.testing.assert_close(fn(z)[2], z.argmax())


@pytest.mark.parametrize("dtype", [I32, I64, BOOL])
def test_integer_and_bool_reductions_are_exact(dtype):
    x = torch.randint(-5, 6, (7, 100)).to(dtype)
    g = G(x)
    outs, expected = [], []
    if dtype == BOOL:
        for rtype, ref in [("any", lambda t: t.any(1)), ("all", lambda t: t.all(1))]:
            outs.append(g.reduction([7], [100], rtype, lambda i, r: g.load(0, [i[0], r[0]]), BOOL))
            expected.append(ref(x))
        outs.append(g.reduction([7], [100], "sum", lambda i, r: ops.to_dtype(g.load(0, [i[0], r[0]]), I64), I64, I64))
        expected.append(x.sum(1))
    else:
        for rtype in ["sum", "max", "min", "argmax", "argmin"]:
            od = I64 if rtype.startswith("arg") else dtype
            outs.append(g.reduction([7], [100], rtype, lambda i, r: g.load(0, [i[0], r[0]]), od, dtype))
            expected.append(REDUCTIONS[rtype](x, 1).to(od))
    check(g.schedule(outs), [x], expected)


def softmax_schedule(x, dtype, internal=True):
    g = G(x, dynamic=True)
    R, N = g.size(x.shape[0]), g.size(x.shape[1])
    ld = lambda i, j: _f(g.load(0, [i, j]), dtype)
    mx = g.reduction([R], [N], "max", lambda i, r: ld(i[0], r[0]), F32)
    e = lambda i, j: ops.exp(ops.sub(ld(i, j), g.loader(mx)([i])))
    sm = g.reduction([R], [N], "sum", lambda i, r: e(i[0], r[0]), F32)
    out = g.pointwise([R, N], lambda i: _back(ops.truediv(e(i[0], i[1]), g.loader(sm)([i[0]])), dtype), dtype)
    return g.schedule([out], groups=[[mx, sm, out]], internal={mx.name, sm.name} if internal else ())


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_softmax_one_fused_kernel(dtype):
    x = torch.randn(33, 257).to(dtype)
    x[1, 3] = -math.inf
    fn = check(softmax_schedule(x, dtype), [x], [torch.softmax(x.float(), -1).to(dtype)])
    (k,) = fn.module.kernels
    assert k.meta["locals"] == ["buf0", "buf1"]  # the row max and sum live in registers
    assert k.meta["buffers"] == ["buf2", "arg0"]
    assert "buf0" not in fn.module.wrapper_source  # never allocated
    y = torch.randn(4, 7).to(dtype)
    torch.testing.assert_close(fn(y)[0], torch.softmax(y.float(), -1).to(dtype))


def test_softmax_without_internal_buffers_uses_memory():
    x = torch.randn(8, 100)
    fn = check(softmax_schedule(x, F32, internal=False), [x], [torch.softmax(x, -1)])
    assert "buf0 = empty_strided_cpu" in fn.module.wrapper_source


def test_softmax_reductions_vectorize():
    x = torch.randn(8, 100)
    fn = compile_sched(softmax_schedule(x, F32))
    loops = vectorized_loops(fn.module.kernels[0].source)
    assert sum(ln.startswith("for (int64_t l = 0; l < 16; l++)") for ln in loops) == 2  # max, sum lanes
    assert "for (int64_t r0 = 0; r0 < s1; r0++)" in loops  # the pointwise output loop


def test_layernorm_gelu_fused():
    x = torch.randn(16, 96)
    w, b = torch.randn(96), torch.randn(96)
    g = G(x, w, b, dynamic=True)
    R, N = g.size(16), g.size(96)
    ld = lambda i, j: g.load(0, [i, j])
    mean = g.reduction([R], [N], "sum", lambda i, r: ops.truediv(ld(i[0], r[0]), ops.index_expr(N, F32)), F32)
    d = lambda i, j: ops.sub(ld(i, j), g.loader(mean)([i]))
    var = g.reduction([R], [N], "sum", lambda i, r: ops.truediv(ops.mul(d(i[0], r[0]), d(i[0], r[0])),
                                                               ops.index_expr(N, F32)), F32)

    def out_fn(i):
        rstd = ops.rsqrt(ops.add(g.loader(var)([i[0]]), ops.constant(1e-5, F32)))
        y = ops.add(ops.mul(ops.mul(d(i[0], i[1]), rstd), g.load(1, [i[1]])), g.load(2, [i[1]]))
        half = ops.constant(0.5, F32)
        return ops.mul(ops.mul(y, half), ops.add(ops.constant(1.0, F32),
                                                 ops.erf(ops.mul(y, ops.constant(1 / math.sqrt(2), F32)))))

    out = g.pointwise([R, N], out_fn, F32)
    sched = g.schedule([out], groups=[[mean, var, out]], internal={mean.name, var.name})
    expected = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (96,), w, b, 1e-5))
    fn = check(sched, [x, w, b], [expected], rtol=1e-4, atol=1e-5)
    x2 = torch.randn(3, 500)
    w2, b2 = torch.randn(500), torch.randn(500)
    exp2 = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x2, (500,), w2, b2, 1e-5))
    torch.testing.assert_close(fn(x2, w2, b2)[0], exp2, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# indexing
# ---------------------------------------------------------------------------------------------


def test_indirect_indexing_gather_and_atomic_scatter_add():
    table = torch.randn(10, 16)
    idx = torch.tensor([3, -1, 0, 9, 3, 3], dtype=I64)
    g = G(table, idx)
    gathered = g.pointwise([6, 16], lambda i: g.load(0, [ops.indirect_indexing(g.load(1, [i[0]]), 10), i[1]]), F32)
    sched = g.schedule([gathered])
    check(sched, [table, idx], [table[idx]])

    src = torch.randn(6, 16)
    g = G(src, idx)
    zeros = g.pointwise([10, 16], lambda i: ops.constant(0.0, F32), F32)

    def scatter_body(outer, inner):
        j = ops.indirect_indexing(g.load(1, [outer[0]]), 10)
        ops.store(zeros.name, zeros.layout.index([j, outer[1]]), g.load(0, outer), mode="atomic_add")

    from kiln_loopir.ir import FusedGroup, SchedNode

    sched = g.schedule([zeros])
    sched.steps.append(FusedGroup("scatter", [sympy.Integer(6), sympy.Integer(16)],
                                  [SchedNode(zeros, "pointwise", [], scatter_body)]))
    expected = torch.zeros(10, 16).index_add_(0, idx % 10, src)
    fn = check(sched, [src, idx], [expected])
    assert "#pragma omp simd" not in fn.module.kernels[1].meta["body"]


def test_index_expr_and_modular_indexing():
    from kiln_loopir.sizevars import FloorDiv, ModularIndexing

    x = torch.randn(6, 10)
    g = G(x)
    # view [6, 10] as [60] and read it back as [10, 6] transposed-ish: out[i, j] = flat[(i*6 + j)]
    out = g.pointwise([10, 6], lambda i: ops.add(
        g.load(0, [FloorDiv(i[0] * 6 + i[1], 10), ModularIndexing(i[0] * 6 + i[1], 1, 10)]),
        ops.index_expr(sympy.Min(i[0], 4), F32)), F32)
    expected = x.reshape(10, 6) + torch.arange(10).clamp(max=4).float()[:, None]
    check(g.schedule([out]), [x], [expected])
