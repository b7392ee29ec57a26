"""kiln.compile: torch.compile's signature over kiln_frontend."""

from __future__ import annotations

import kiln
import pytest
import torch


def _frontend_api():
    import kiln_frontend as frontend
    import kiln_frontend.api
    import kiln_frontend.convert  # noqa: F401  (the capture layer)

    return frontend


def f(x, y):
    return torch.sin(x) + torch.cos(y)


def test_bad_options_raise_at_compile_time():
    with pytest.raises(ValueError, match="known options"):
        kiln.compile(f, options={"turbo": True})
    with pytest.raises(ValueError, match="known codegens"):
        kiln.compile(f, options={"codegen": "fortran"})


def test_disable_returns_model():
    assert kiln.compile(f, disable=True) is f


def test_compile_with_eager_backend():
    _frontend_api()
    compiled = kiln.compile(f, backend="eager")
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(compiled(x, y), f(x, y))


def test_compile_decorator_with_kiln(needs_cpp):
    _frontend_api()

    @kiln.compile
    def g(x, y):
        return torch.sin(x) + torch.cos(y)

    x, y = torch.randn(5, 3), torch.randn(5, 3)
    before = kiln.stats().graphs_compiled
    torch.testing.assert_close(g(x, y), f(x, y))
    assert kiln.stats().graphs_compiled == before + 1


def test_compile_with_loopir_interpret(needs_interpreter):
    _frontend_api()
    compiled = kiln.compile(f, backend="loopir_interpret", options={"debug": False})
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(compiled(x, y), f(x, y))


def test_compiled_module_attribute_stores_reach_the_module():
    """``kiln.compile(m)`` is a view of ``m`` (as torch's OptimizedModule): ``cm.k = 3``
    sets ``m.k``, and a forward reading it recompiles and uses the new value."""
    _frontend_api()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 1

        def forward(self, x):
            return x * self.k

    m = M()
    cm = kiln.compile(m, backend="eager", fullgraph=True)
    x = torch.ones(3)
    torch.testing.assert_close(cm(x), x)
    cm.k = 3
    assert m.k == 3 and "k" not in cm.__dict__
    torch.testing.assert_close(cm(x), x * 3)
    del cm.k
    assert not hasattr(m, "k")
    m.eval()
    assert not cm.training
