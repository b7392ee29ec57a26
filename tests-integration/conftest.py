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


@pytest.fixture
def fresh_kiln():
    """Zeroed kiln counters and an empty frontend cache (each model compiles from scratch)."""
    import kiln
    import kiln_frontend

    kiln_frontend.reset()
    kiln.reset_stats()
    yield
    kiln_frontend.reset()
