"""Full-stack tests on real models. See docs/testing.md for the torchvision note."""

import os
import sys
from pathlib import Path

# pytest runs with --import-mode=importlib (pyproject.toml), which does not put this folder on
# sys.path: do it here so that the helper modules beside the tests import
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _torchvision_shim  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# Kernels of the Triton codegen on CPU tensors run Triton's interpreter, which Triton reads when
# it is first imported (as codegen-triton's and kiln's conftests do): tests-integration runs on
# its own in CI (`nox -s integration`), not only after those conftests in `nox -s tests`.
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_torchvision_shim.install()

#: KILN_CACHE_DIR as the session found it: a module or class fixture that changed it chose
#: the folder its tests share (kernels compiled once per module)
_AMBIENT_CACHE_DIR = os.environ.get("KILN_CACHE_DIR")


@pytest.fixture(autouse=True)
def kiln_cache_dir(tmp_path, monkeypatch):
    """Each test's own empty ``KILN_CACHE_DIR``, unless a wider fixture chose one: the shared
    ``~/.cache/kiln`` would let a compile hit what an earlier session stored, and a test that
    reads kiln.stats() counters would then pass without the work it means to count."""
    chosen = os.environ.get("KILN_CACHE_DIR")
    if chosen != _AMBIENT_CACHE_DIR:
        return Path(chosen)
    path = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    return path


@pytest.fixture
def fresh_kiln():
    """Zeroed kiln counters and an empty frontend cache (each model compiles from scratch)."""
    import kiln
    import kiln_frontend

    kiln_frontend.reset()
    kiln.reset_stats()
    yield
    kiln_frontend.reset()
