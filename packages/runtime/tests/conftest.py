import pytest


@pytest.fixture(autouse=True)
def _tmp_cache_dir(tmp_path, monkeypatch):
    """Every test gets its own KILN_CACHE_DIR."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln-cache"))
    yield tmp_path / "kiln-cache"
