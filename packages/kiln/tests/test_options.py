"""kiln.Options: validation and defaults."""

from __future__ import annotations

import pytest
from kiln import Options


def test_defaults():
    o = Options.from_user(None)
    assert o == Options()
    assert o.codegen is None and o.cpp_flags == () and o.mode is None


def test_from_dict_and_passthrough():
    o = Options.from_user({"codegen": "cpp", "cpp_flags": "-O2 -ffast-math", "mode": "default"})
    assert o.codegen == "cpp"
    assert o.cpp_flags == ("-O2", "-ffast-math")
    assert Options.from_user(o) is o


def test_unknown_key_lists_known_ones():
    with pytest.raises(ValueError) as e:
        Options.from_user({"codegen": "cpp", "fast": True})
    msg = str(e.value)
    assert "'fast'" in msg
    for key in ("codegen", "debug", "debug_dir", "cpp_flags", "num_threads", "mode"):
        assert key in msg


def test_unknown_codegen_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown codegen 'cuda_magic'.*cpp, triton"):
        Options.from_user({"codegen": "cuda_magic"})


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown mode 'ludicrous'.*reduce-overhead"):
        Options(mode="ludicrous")


def test_not_a_dict():
    with pytest.raises(TypeError):
        Options.from_user(["codegen"])


def test_debug_from_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_COMPILE_DEBUG", raising=False)
    monkeypatch.delenv("KILN_DEBUG_DIR", raising=False)
    assert not Options().debug_enabled
    assert Options().debug_root == "kiln_debug"
    monkeypatch.setenv("KILN_COMPILE_DEBUG", "1")
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    assert Options().debug_enabled
    assert Options().debug_root == str(tmp_path)
    assert not Options(debug=False).debug_enabled
    assert Options(debug_dir="x").debug_root == "x"
