"""Triton tests run on CPU tensors under the Triton interpreter (no GPU needed). Puts this
folder on ``sys.path`` (pytest runs with ``--import-mode=importlib``, which does not) so the
tests can import ``_triton_sm90``."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _kiln_cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def pytest_collection_modifyitems(items):
    for item in items:  # this hook sees every item of the session: mark only ours
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.triton_interpret)
