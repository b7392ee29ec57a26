"""Full-stack tests on real models. See docs/testing.md for the torchvision note."""

import sys
from pathlib import Path

# pytest runs with --import-mode=importlib (pyproject.toml), which does not put this folder on
# sys.path: do it here so that the helper modules beside the tests import
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _torchvision_shim  # noqa: E402
import pytest  # noqa: E402

_torchvision_shim.install()


@pytest.fixture
def fresh_kiln():
    """Zeroed kiln counters and an empty frontend cache (each model compiles from scratch)."""
    import kiln
    import kiln_frontend

    kiln_frontend.reset()
    kiln.reset_stats()
    yield
    kiln_frontend.reset()
