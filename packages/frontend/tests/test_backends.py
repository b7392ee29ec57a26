"""The backend registry: register_backend, lookup_backend, list_backends, entry points."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import kiln_frontend
import pytest
from kiln_frontend import backends, eval_frame
from kiln_frontend.backends import InvalidBackend


@pytest.fixture(autouse=True)
def clean_registry():
    saved = dict(backends._registered)
    yield
    backends._registered.clear()
    backends._registered.update(saved)
    backends._entry_points = None


def test_eager_is_built_in_and_returns_forward():
    assert "eager" in kiln_frontend.list_backends()
    eager = kiln_frontend.lookup_backend("eager")

    class GM:
        def forward(self, x):
            return x * 2

    gm = GM()
    assert eager(gm, [1]) == gm.forward


def test_register_backend_forms():
    @kiln_frontend.register_backend
    def bk_plain(gm, example_inputs):
        return gm

    @kiln_frontend.register_backend(name="bk_named")
    def whatever(gm, example_inputs):
        return gm

    @kiln_frontend.register_backend("bk_positional")
    def whatever2(gm, example_inputs):
        return gm

    def bk_call(gm, example_inputs):
        return gm

    assert kiln_frontend.register_backend(bk_call, name="bk_called") is bk_call
    assert kiln_frontend.lookup_backend("bk_plain") is bk_plain
    assert kiln_frontend.lookup_backend("bk_named") is whatever
    assert kiln_frontend.lookup_backend("bk_positional") is whatever2
    assert kiln_frontend.lookup_backend("bk_called") is bk_call
    names = kiln_frontend.list_backends()
    assert names == sorted(names)
    assert {"bk_plain", "bk_named", "bk_positional", "bk_called", "eager"} <= set(names)


def test_register_conflicts_and_errors():
    def a(gm, example_inputs):
        return gm

    def b(gm, example_inputs):
        return gm

    kiln_frontend.register_backend(a, name="dup")
    kiln_frontend.register_backend(a, name="dup")  # same function again: fine
    with pytest.raises(ValueError, match="already registered as 'dup'"):
        kiln_frontend.register_backend(b, name="dup")
    kiln_frontend.register_backend(b, name="dup", replace=True)
    assert kiln_frontend.lookup_backend("dup") is b
    with pytest.raises(TypeError):
        kiln_frontend.register_backend(42)


def test_lookup_callable_passes_through():
    def mine(gm, example_inputs):
        return gm

    assert kiln_frontend.lookup_backend(mine) is mine
    with pytest.raises(TypeError):
        kiln_frontend.lookup_backend(3)


def test_unknown_backend_lists_known_ones_sorted():
    kiln_frontend.register_backend(lambda gm, ex: gm, name="zzz_last")
    kiln_frontend.register_backend(lambda gm, ex: gm, name="aaa_first")
    with pytest.raises(InvalidBackend) as info:
        kiln_frontend.lookup_backend("nope")
    err = info.value
    assert isinstance(err, ValueError)
    assert err.name == "nope"
    assert err.known == sorted(err.known)
    assert {"aaa_first", "eager", "zzz_last"} <= set(err.known)
    msg = str(err)
    assert msg.startswith("unknown backend 'nope'; known backends: ")
    assert msg.index("aaa_first") < msg.index("eager") < msg.index("zzz_last")


def _make_third_party_dist(root, *, dist="kiln_toy_backend", module="kiln_toy_backend_mod",
                           backend="toy"):
    """What `pip install kiln-toy-backend` leaves in site-packages: a module + dist-info."""
    (root / f"{module}.py").write_text(textwrap.dedent(
        """
        CALLS = []

        def toy_backend(gm, example_inputs):
            CALLS.append(len(example_inputs))
            return gm
        """
    ))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[kiln.backends]\n{backend} = {module}:toy_backend\n")
    (info / "RECORD").write_text("")


def test_third_party_entry_point_backend(tmp_path, monkeypatch):
    _make_third_party_dist(tmp_path)
    assert "toy" not in kiln_frontend.list_backends()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "toy" in kiln_frontend.list_backends()
    assert "kiln_toy_backend_mod" not in sys.modules  # listed without importing it
    fn = kiln_frontend.lookup_backend("toy")
    import kiln_toy_backend_mod

    assert fn is kiln_toy_backend_mod.toy_backend

    # usable by name through optimize: the capture layer receives it as compiler_fn
    received = []

    def fake_convert(frame, *, compiler_fn, nopython, frame_state, **kw):
        received.append(compiler_fn)
        compiler_fn("gm", [1, 2])
        return None

    monkeypatch.setattr(eval_frame, "convert_frame_fn", fake_convert)
    kiln_frontend.reset()

    @kiln_frontend.optimize("toy")
    def f(x):
        return x + 1

    assert f(1) == 2
    assert received == [kiln_toy_backend_mod.toy_backend]
    assert kiln_toy_backend_mod.CALLS == [2]
    kiln_frontend.reset()
    sys.modules.pop("kiln_toy_backend_mod", None)


def test_entry_point_backend_in_a_fresh_interpreter(tmp_path):
    """Discovery works from a clean process, as after a real `pip install`."""
    _make_third_party_dist(tmp_path, dist="kiln_toy2", module="kiln_toy2_mod", backend="toy2")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import kiln_frontend as k; print('toy2' in k.list_backends());"
        "print(k.lookup_backend('toy2').__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", "kiln_toy2_mod"]


def test_registered_name_wins_over_entry_point(tmp_path, monkeypatch):
    _make_third_party_dist(tmp_path, dist="kiln_toy3", module="kiln_toy3_mod", backend="toy3")
    monkeypatch.syspath_prepend(str(tmp_path))

    def local(gm, example_inputs):
        return gm

    kiln_frontend.register_backend(local, name="toy3")
    assert kiln_frontend.lookup_backend("toy3") is local
    assert kiln_frontend.list_backends().count("toy3") == 1
