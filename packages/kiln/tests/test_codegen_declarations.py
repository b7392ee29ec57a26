"""What a codegen declares on its ``CodegenEntry`` (``toolchain``, ``synchronize``) is what kiln
uses: cache keys carry each loadable codegen's toolchain, and the profiler's clock waits with
the graph's codegen's ``synchronize``. kiln itself names no codegen."""

from __future__ import annotations

import pytest
import torch
from kiln import cache
from kiln.codegens import synchronize_of, toolchains
from kiln.options import Options
from kiln_loopir import codegen_registry
from kiln_loopir.codegen_registry import CodegenEntry, register_codegen

_TOOLCHAIN = {"text": "probe-cc 1.0"}
_SYNCS: list[str] = []


def _probe_toolchain() -> str:
    if _TOOLCHAIN["text"] is None:
        raise OSError("probe compiler missing")
    return _TOOLCHAIN["text"]


@pytest.fixture
def probe_codegen():
    """A codegen registered for this test only (other tests list the known codegens)."""
    name = "toolchain_probe"
    register_codegen(CodegenEntry(name, devices=("cpu",), compile_error=RuntimeError,
                                  build=lambda options: None, priority=-100,
                                  toolchain=_probe_toolchain,
                                  synchronize=lambda: _SYNCS.append("sync")))
    cache._toolchains.cache_clear()
    yield name
    codegen_registry._registered.pop(name, None)
    cache._toolchains.cache_clear()
    _TOOLCHAIN["text"] = "probe-cc 1.0"


def _key() -> str:
    cache._toolchains.cache_clear()
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    digest, _ = cache.graph_key(gm, [torch.randn(2, 4)], Options())
    return digest


def test_a_new_toolchain_changes_every_cache_key(probe_codegen):
    before = _key()
    assert _key() == before
    _TOOLCHAIN["text"] = "probe-cc 2.0"
    assert _key() != before


def test_a_toolchain_that_cannot_be_asked_keeps_keys_stable(probe_codegen):
    _TOOLCHAIN["text"] = None
    assert toolchains()[probe_codegen] == "unavailable (OSError)"
    assert _key() == _key()


def test_the_installed_codegens_declare_their_toolchains():
    found = toolchains()
    assert found["cpp"].startswith("cxx "), found
    assert found["triton"].startswith("triton "), found


def test_the_profiler_waits_with_the_codegens_synchronize(probe_codegen):
    from kiln_loopir.codegen_protocol import GeneratedModule

    assert synchronize_of("cpp") is None  # a C++ kernel returns when it is done
    sync = synchronize_of(probe_codegen)
    _SYNCS.clear()
    sync()
    assert _SYNCS == ["sync"]
    assert GeneratedModule(wrapper_source="", kernels=[], synchronize=sync).synchronize is sync


def test_profiled_kernels_are_timed_between_device_waits(monkeypatch):
    """``KILN_LOGS=perf``: the timing clock calls the graph's codegen's ``synchronize``."""
    import kiln.assemble
    from kiln.backend import kiln_backend
    from kiln_runtime import profile

    calls: list[str] = []
    monkeypatch.setattr(kiln.assemble, "synchronize_of", lambda name: lambda: calls.append(name))
    monkeypatch.setenv("KILN_LOGS", "perf")
    profile.reset()
    gm = torch.fx.symbolic_trace(lambda x: (x.sin() + 1,))
    x = torch.randn(8)
    with torch.no_grad():
        compiled = kiln_backend(gm, [x])
        for _ in range(3):  # the first call checks the kernels against eager, untimed
            out = compiled(x)
    out = out[0] if isinstance(out, (list, tuple)) else out
    torch.testing.assert_close(out, x.sin() + 1)
    assert calls and set(calls) == {"cpp"}
    profile.reset()
