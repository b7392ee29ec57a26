"""The generic wrapper generator, with a tiny pure-Python codegen (no runtime, no C++)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sympy
import torch
from kiln_loopir.analysis import body_deps
from kiln_loopir.codegen_protocol import GeneratedModule, KernelDef
from kiln_loopir.ir import (
    Allocation,
    ComputedBuffer,
    ExternKernel,
    ExternNode,
    FusedGroup,
    InputBuffer,
    Layout,
    LoopGraph,
    MultiOutput,
    Pointwise,
    Reduction,
    ReinterpretView,
    SchedNode,
    Schedule,
)
from kiln_loopir.ops_spec import OPS
from kiln_loopir.sizevars import SizeVarSource, index_symbol, reduction_symbol, size_symbol
from kiln_loopir.virtualized import ops, set_ops_handler
from kiln_loopir.wrapper import extern_call_source, generate_wrapper, py_arg

aten = torch.ops.aten
F32 = torch.float32


# ---------------------------------------------------------------------------------------------
# a scalar Python "codegen": each kernel runs its group element by element (tiny tensors only)
# ---------------------------------------------------------------------------------------------


class _ScalarOps:
    def __init__(self, bufs, env):
        self.bufs, self.env = bufs, env
        self.vals, self.rtype, self.target = [], None, None

    def _i(self, index):
        return int(sympy.sympify(index).xreplace(self.env))

    def load(self, name, index):
        return self.bufs[name][self._i(index)]

    def store(self, name, index, value, mode=None):
        if mode == "atomic_add":
            self.bufs[name][self._i(index)] += value
        else:
            self.bufs[name][self._i(index)] = value

    def reduction(self, dtype, src_dtype, rtype, value):
        self.vals.append(value)
        self.rtype = rtype
        return None

    def store_reduction(self, name, index, value):
        self.target = (name, self._i(index))

    def index_expr(self, expr, dtype):
        return torch.tensor(self._i(expr), dtype=dtype)

    def constant(self, value, dtype):
        return torch.tensor(value, dtype=dtype)

    def indirect_indexing(self, x, size, check=True):
        raise NotImplementedError

    def __getattr__(self, name):
        ref = OPS[name].ref
        return lambda *args: ref(*args)


def _run_group(group, bufs, env):
    outer = [index_symbol(k) for k in range(len(group.outer))]
    ranges = [int(sympy.sympify(r).xreplace(env)) for r in group.outer]
    for point in _points(ranges):
        env_o = env | dict(zip(outer, point, strict=True))
        for node in group.nodes:
            inner = [reduction_symbol(k) for k in range(len(node.inner))]
            iranges = [int(sympy.sympify(r).xreplace(env)) for r in node.inner]
            h = _ScalarOps(bufs, env_o)
            with set_ops_handler(h):
                for ipoint in _points(iranges):
                    h.env = env_o | dict(zip(inner, ipoint, strict=True))
                    node.body(outer, inner)
            if node.kind == "reduction":
                name, i = h.target
                v = torch.stack(h.vals)
                red = {"sum": v.sum, "max": v.amax, "min": v.amin, "argmax": v.argmax}[h.rtype]
                bufs[name][i] = red()


def _points(ranges):
    if not ranges:
        yield ()
        return
    for i in range(ranges[0]):
        for rest in _points(ranges[1:]):
            yield (i, *rest)


class PyCodegen:
    name = "py"

    def __init__(self):
        self.n = 0

    def define_kernel(self, group, sched):
        names = [b for b in group.buffer_names() if b not in group.internal_buffers]
        outer = [index_symbol(k) for k in range(len(group.outer))]
        for node in group.nodes:
            deps = body_deps(node.body, outer, [reduction_symbol(k) for k in range(len(node.inner))])
            names += [d.name for d in deps.reads if d.name not in names and d.name not in group.internal_buffers]
        syms = [s.name for s in group.size_symbols()]
        k = KernelDef(f"py_kernel_{self.n}", f"# python kernel for {group.name}", names + syms, group)
        self.n += 1
        return k

    def kernel_call(self, kernel):
        return f"{kernel.name}({', '.join(kernel.arg_names)})"

    def extern_call(self, node):
        return extern_call_source(node)

    def finalize(self, kernels):
        out = {}
        for k in kernels:
            def run(*args, k=k):
                nbuf = len(k.arg_names) - len(k.group.size_symbols())
                bufs = {n: torch.as_strided(t, (t.untyped_storage().nbytes() // t.element_size(),), (1,))
                        for n, t in zip(k.arg_names[:nbuf], args[:nbuf], strict=True)}
                env = {size_symbol(int(n[1:])): v for n, v in zip(k.arg_names[nbuf:], args[nbuf:], strict=True)}
                # internal buffers that the wrapper did not allocate live here
                for n in k.group.internal_buffers:
                    lay = next(nd.buffer.layout for nd in k.group.nodes if nd.buffer.name == n)
                    numel = int(sympy.sympify(lay.storage_size()).xreplace(env))
                    bufs[n] = torch.empty(numel, dtype=lay.dtype)
                _run_group(k.group, bufs, env)
            out[k.name] = run
        return out


def load(module: GeneratedModule):
    """What kiln_runtime.load does, without depending on it."""
    ns = {
        "empty_strided_cpu": lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype),
        "reinterpret_tensor": lambda t, size, stride, offset=0: torch.as_strided(
            t, size, stride, t.storage_offset() + offset),
        "aten_direct": torch.ops.aten,
    }
    ns.update(module.build_namespace())
    exec(compile(module.wrapper_source, "<wrapper>", "exec"), ns)
    return lambda *args: ns["call"](list(args))


# ---------------------------------------------------------------------------------------------
# graphs
# ---------------------------------------------------------------------------------------------


def _graph(*layouts, dynamic_sizes=None):
    g = LoopGraph()
    g.num_placeholders = len(layouts)
    for pos, lay in enumerate(layouts):
        g.add_input(InputBuffer(f"arg{pos}", lay, pos))
    for sym, src in (dynamic_sizes or {}).items():
        g.sizevars[sym] = src
    return g


def _pw(g, ranges, fn, dtype=F32, layout=None):
    lay = layout or Layout.contiguous("cpu", dtype, ranges)
    return g.register_buffer(ComputedBuffer(g.new_name(), lay, Pointwise("cpu", dtype, ranges, fn)))


def _node(buf, n_outer=None):
    body = buf.store_body()
    if buf.is_reduction():
        return SchedNode(buf, "reduction", list(buf.data.reduction_ranges), lambda outer, inner: body(outer, inner))
    n_outer = len(buf.data.ranges) if n_outer is None else n_outer
    return SchedNode(buf, "pointwise", list(buf.data.ranges[n_outer:]), lambda outer, inner: body(list(outer) + list(inner)))


def _group(name, buf, allocs, frees=(), internal=()):
    return FusedGroup(name, list(buf.data.ranges), [_node(buf)], allocations=list(allocs),
                      frees=list(frees), internal_buffers=set(internal))


def test_dynamic_pointwise_wrapper_text_and_result():
    s0, s1 = size_symbol(0), size_symbol(1)
    lay = Layout.contiguous("cpu", F32, (s0, s1))
    g = _graph(lay, lay, dynamic_sizes={s0: SizeVarSource(0, 0), s1: SizeVarSource(0, 1)})
    x = g.inputs[0].make_loader()
    y = g.inputs[1].make_loader()
    buf0 = _pw(g, [s0, s1], lambda i: ops.add(ops.cos(x(i)), ops.sin(y(i))))
    g.outputs = [ReinterpretView(buf0, buf0.layout)]
    sched = Schedule(g, [_group("g0", buf0, [Allocation("buf0", buf0.layout)])])
    module = generate_wrapper(sched, PyCodegen())
    src = module.wrapper_source
    assert "def call(args):" in src
    assert "    arg0, arg1 = args\n    args.clear()\n" in src
    assert "    s0 = arg0.size(0)\n    s1 = arg0.size(1)\n" in src
    assert "    buf0 = empty_strided_cpu((s0, s1), (s1, 1), torch.float32)\n" in src
    assert "    py_kernel_0(buf0, arg0, arg1, s0, s1)\n" in src
    assert src.rstrip().endswith("return [buf0]")
    assert src.count("s0 = ") == 1  # each size read once
    fn = load(module)
    for shape in [(2, 3), (3, 1)]:
        a, b = torch.randn(shape), torch.randn(shape)
        (out,) = fn(a, b)
        torch.testing.assert_close(out, a.cos() + b.sin())


def test_memory_plan_reuse_and_frees():
    lay = Layout.contiguous("cpu", F32, (4,))
    g = _graph(lay)
    x = g.inputs[0].make_loader()
    b0 = _pw(g, [4], lambda i: ops.mul(x(i), x(i)))  # temp
    b1 = _pw(g, [4], lambda i: ops.add(g.get_buffer("buf0").make_loader()(i), ops.constant(1.0, F32)))  # temp
    b2 = _pw(g, [4], lambda i: ops.neg(b1.make_loader()(i)))  # output, reuses buf0's storage
    g.outputs = [ReinterpretView(b2, b2.layout)]
    sched = Schedule(g, [
        _group("g0", b0, [Allocation("buf0", lay)]),
        _group("g1", b1, [Allocation("buf1", lay)], frees=["buf0"]),
        _group("g2", b2, [Allocation("buf2", lay, reuses="buf0")], frees=["buf1"]),
    ])
    src = generate_wrapper(sched, PyCodegen()).wrapper_source
    assert "buf2 = buf0; del buf0  # reuse" in src
    assert "del buf1" in src
    assert src.count("del buf0") == 1  # not deleted at its last use: its storage is reused
    assert "del buf2" not in src  # outputs are never freed
    a = torch.randn(4)
    (out,) = load(generate_wrapper(sched, PyCodegen()))(a)
    torch.testing.assert_close(out, -(a * a + 1))


def test_outputs_as_views_and_inputs_returned():
    lay = Layout.contiguous("cpu", F32, (3, 4))
    g = _graph(lay)
    x = g.inputs[0].make_loader()
    b0 = _pw(g, [3, 4], lambda i: ops.mul(x(i), ops.constant(2.0, F32)))
    g.outputs = [
        ReinterpretView(b0, b0.layout),
        ReinterpretView(b0, Layout("cpu", F32, (4, 3), (1, 4))),  # b0.t()
        ReinterpretView(b0, Layout("cpu", F32, (2,), (4,), offset=1)),  # b0[:2, 1]
        ReinterpretView(g.inputs[0], lay),
    ]
    sched = Schedule(g, [_group("g0", b0, [Allocation("buf0", lay)])])
    module = generate_wrapper(sched, PyCodegen())
    assert "reinterpret_tensor(buf0, (4, 3), (1, 4), 0)" in module.wrapper_source
    a = torch.randn(3, 4)
    out, t, col, same = load(module)(a)
    torch.testing.assert_close(t, (a * 2).t())
    assert t.stride() == (1, 4)
    torch.testing.assert_close(col, (a * 2)[:2, 1])
    assert t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    assert same is a


def test_extern_calls_and_multi_outputs():
    lay = Layout.contiguous("cpu", F32, (3, 5))
    g = _graph(lay, Layout.contiguous("cpu", F32, (5, 2)))
    a, b = g.inputs
    mm = g.register_buffer(ExternKernel("buf0", Layout.contiguous("cpu", F32, (3, 2)), aten.mm.default, [a, b], {}))
    mx = ExternKernel("buf1", None, aten.max.dim, [a, 1], {"keepdim": False})
    g.register_buffer(mx)
    vals = g.register_buffer(MultiOutput("buf2", Layout.contiguous("cpu", F32, (3,)), mx, 0))
    idx = g.register_buffer(MultiOutput("buf3", Layout.contiguous("cpu", torch.int64, (3,)), mx, 1))
    mx.outputs = [vals, idx]
    g.outputs = [ReinterpretView(mm, mm.layout), ReinterpretView(idx, idx.layout)]
    sched = Schedule(g, [ExternNode(mm), ExternNode(mx, frees=["buf2"])])
    src = generate_wrapper(sched, PyCodegen()).wrapper_source
    assert "buf0 = aten.mm.default(arg0, arg1)" in src
    assert "buf1 = aten.max.dim(arg0, 1, keepdim=False)" in src
    assert "buf2 = buf1[0]" in src and "buf3 = buf1[1]" in src
    assert "del buf1" in src and "del buf2" in src
    x, y = torch.randn(3, 5), torch.randn(5, 2)
    out, ind = load(generate_wrapper(sched, PyCodegen()))(x, y)
    torch.testing.assert_close(out, x @ y)
    assert torch.equal(ind, x.argmax(1))


def test_py_arg_texts():
    s0 = size_symbol(0)
    assert py_arg(s0 * 2) == "2*s0"
    assert py_arg([1, 2.5, None, True]) == "[1, 2.5, None, True]"
    assert py_arg((3,)) == "(3,)"
    assert py_arg(float("-inf")) == "float('-inf')"
    assert py_arg(torch.float16) == "torch.float16"
    assert py_arg(torch.device("cpu")) == "torch.device('cpu')"
    assert py_arg(torch.contiguous_format) == "torch.contiguous_format"
    with pytest.raises(TypeError):
        py_arg(object())


def _row_max_then_sub_graph():
    """x [3, 6], its row max (a reduction into [3]) and ``x - rowmax`` [3, 6]: (graph, the
    max buffer, the difference, the max's layout)."""
    g = _graph(Layout.contiguous("cpu", F32, (3, 6)))
    x = g.inputs[0].make_loader()
    lay_r = Layout.contiguous("cpu", F32, (3,))
    mx = g.register_buffer(ComputedBuffer(g.new_name(), lay_r, Reduction("cpu", F32, F32, [3], [6], "max",
                                                                         lambda i, r: x([i[0], r[0]]))))
    out = _pw(g, [3, 6], lambda i: ops.sub(x(i), mx.make_loader()([i[0]])))
    return g, mx, out, lay_r


def test_internal_buffers_not_allocated_when_kernel_keeps_them():
    s0 = size_symbol(0)
    g, mx, out, lay_r = _row_max_then_sub_graph()
    g.outputs = [ReinterpretView(out, out.layout)]
    grp = FusedGroup("g0", [sympy.Integer(3)], [_node(mx), _node(out, 1)],
                     allocations=[Allocation("buf0", lay_r, internal=True), Allocation("buf1", out.layout)],
                     internal_buffers={"buf0"})
    module = generate_wrapper(Schedule(g, [grp]), PyCodegen())
    assert "buf0 = empty" not in module.wrapper_source
    a = torch.randn(3, 6)
    torch.testing.assert_close(load(module)(a)[0], a - a.amax(1, keepdim=True))
    del s0


def test_output_code_runs_standalone(tmp_path):
    lay = Layout.contiguous("cpu", F32, (size_symbol(0), 8))
    g = _graph(lay, Layout.contiguous("cpu", F32, (8, 4)), dynamic_sizes={size_symbol(0): SizeVarSource(0, 0)})
    a, b = g.inputs
    mm = g.register_buffer(ExternKernel("buf0", Layout.contiguous("cpu", F32, (size_symbol(0), 4)),
                                        aten.mm.default, [a, b], {}))
    g.outputs = [ReinterpretView(mm, mm.layout)]
    module = generate_wrapper(Schedule(g, [ExternNode(mm)]), PyCodegen())
    code = module.meta["output_code"]
    assert "def make_inputs():" in code and 'if __name__ == "__main__":' in code
    # the launch helpers come from kiln_runtime in a real install; stub them for this package
    stub = tmp_path / "kiln_runtime" / "launch.py"
    stub.parent.mkdir()
    (stub.parent / "__init__.py").write_text("")
    stub.write_text("import torch\nempty_strided = empty_strided_cpu = empty_strided_cuda = None\n"
                    "aten_direct = torch.ops.aten\n"
                    "def reinterpret_tensor(t, size, stride, offset=0):\n"
                    "    return torch.as_strided(t, size, stride, t.storage_offset() + offset)\n")
    path = tmp_path / "output_code.py"
    path.write_text(code)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ms per call" in proc.stdout


def _softmax_then_row_op_graph():
    """softmax-like group (internal row max kept in registers) then a pointwise step whose
    output has the row max's layout."""
    g, mx, out, lay_r = _row_max_then_sub_graph()
    sm = _pw(g, [3], lambda i: ops.add(out.make_loader()([i[0], 0]), ops.constant(1.0, F32)))
    g.outputs = [ReinterpretView(sm, sm.layout)]
    return g, mx, out, sm, lay_r


def test_scheduler_never_lends_internal_buffers():
    """An internal buffer may never get storage (the codegen keeps it in registers): the memory
    plan neither reuses it nor lets it reuse another buffer."""
    from kiln_loopir import schedule

    g, mx, out, sm, lay_r = _softmax_then_row_op_graph()
    sched = schedule(g)
    internal = {nm for grp in sched.groups for nm in grp.internal_buffers}
    assert mx.name in internal, str(sched)
    for step in sched.steps:
        for a in step.allocations:
            assert a.reuses not in internal, str(sched)
            assert not (a.internal and a.reuses), str(sched)
    src = generate_wrapper(sched, PyCodegen()).wrapper_source
    assert f"{mx.name} = empty" not in src
    a = torch.randn(3, 6)
    torch.testing.assert_close(load(generate_wrapper(sched, PyCodegen()))(a)[0], a[:, 0] - a.amax(1) + 1)


def test_wrapper_rejects_reuse_of_storage_it_never_allocated():
    """A hand-made plan in which buf2 reuses internal buf0, which the kernel kept in registers."""
    g, mx, out, sm, lay_r = _softmax_then_row_op_graph()
    grp = FusedGroup("g0", [sympy.Integer(3)], [_node(mx), _node(out, 1)],
                     allocations=[Allocation("buf0", lay_r, internal=True), Allocation("buf1", out.layout)],
                     internal_buffers={"buf0"}, frees=["buf0"])
    grp2 = _group("g1", sm, [Allocation("buf2", lay_r, reuses="buf0")], frees=["buf1"])
    with pytest.raises(ValueError, match="buf2 reuses buf0"):
        generate_wrapper(Schedule(g, [grp, grp2]), PyCodegen())
