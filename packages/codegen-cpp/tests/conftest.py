import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session", autouse=True)
def kiln_cache_dir(tmp_path_factory):
    """One fresh KILN_CACHE_DIR for the whole test session (kernels compile once)."""
    path = tmp_path_factory.mktemp("kiln-cache")
    old = os.environ.get("KILN_CACHE_DIR")
    os.environ["KILN_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("KILN_CACHE_DIR", None)
    else:
        os.environ["KILN_CACHE_DIR"] = old
