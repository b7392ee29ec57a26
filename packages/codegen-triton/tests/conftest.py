"""Triton tests run on CPU tensors under the Triton interpreter (no GPU needed)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _kiln_cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(items):
    for item in items:  # this hook sees every item of the session: mark only ours
        if str(item.fspath).startswith(HERE):
            item.add_marker(pytest.mark.triton_interpret)
