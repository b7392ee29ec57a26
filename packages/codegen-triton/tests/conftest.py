"""Triton tests run on CPU tensors under the Triton interpreter (no GPU needed)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _kiln_cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.triton_interpret)
