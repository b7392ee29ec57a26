import traceback
from types import SimpleNamespace

import pytest
import torch
from kiln_runtime import counters, load, reinterpret_tensor
from kiln_runtime.launch import assert_size_stride, empty_strided_cpu

WRAPPER = '''
import torch
from kiln_runtime.launch import empty_strided_cpu, reinterpret_tensor

def call(args):
    arg0, arg1 = args
    args.clear()
    s0 = arg0.size(0)
    buf0 = empty_strided_cpu((s0,), (1,), torch.float32)
    kernel_0(buf0, arg0, arg1, s0)
    del arg0, arg1
    return [buf0, reinterpret_tensor(buf0, (s0 // 2,), (2,), 1)]
'''


def kernel_0(out, a, b, n):
    torch.add(a, b, out=out)


def test_load_execs_wrapper_with_namespace():
    counters.clear()
    module = SimpleNamespace(source=WRAPPER, namespace={"kernel_0": kernel_0})
    fn = load(module)
    a, b = torch.randn(6), torch.randn(6)
    out, view = fn(a, b)
    torch.testing.assert_close(out, a + b)
    torch.testing.assert_close(view, (a + b)[1::2])
    assert view._base is out or view.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    assert counters["wrappers_loaded"] == 1
    assert "def call" in fn.source


def test_wrapper_traceback_shows_source():
    src = "def call(args):\n    raise ValueError('boom in wrapper')\n"
    fn = load(SimpleNamespace(source=src, namespace={}))
    with pytest.raises(ValueError) as info:
        fn()
    text = "".join(traceback.format_exception(info.value))
    assert "raise ValueError('boom in wrapper')" in text


def test_load_requires_call():
    with pytest.raises(ValueError, match="call"):
        load(SimpleNamespace(source="x = 1\n", namespace={}))


def test_reinterpret_tensor_offsets_from_view():
    base = torch.arange(10.0)
    v = reinterpret_tensor(base[2:], (2, 2), (2, 1), 1)
    assert v.tolist() == [[3.0, 4.0], [5.0, 6.0]]


def test_empty_strided_and_assert():
    t = empty_strided_cpu((2, 3), (1, 2), torch.float16)
    assert t.dtype == torch.float16 and t.stride() == (1, 2)
    assert_size_stride(t, (2, 3), (1, 2))
    with pytest.raises(AssertionError):
        assert_size_stride(t, (2, 3), (3, 1))
