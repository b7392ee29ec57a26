"""The cache folder holds code (pickles, shared libraries): kiln refuses a folder others could
write, as ssh refuses such a key file, and compiles without the disk cache (one warning)."""

import os
import pickle
import stat
from pathlib import Path

import pytest
from kiln_runtime import (
    DiskCache,
    UnsafeCacheDir,
    UnsafeCacheDirWarning,
    cache_dir,
    counters,
    disk_cache,
    hash_key,
)
from kiln_runtime.disk_cache import check_cache_dir

KEY = hash_key("planted")


class _Payload:
    """A pickle that leaves a mark when it is loaded (as a planted graph artifact would run)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _planted_cache(folder: Path, marker: Path, mode: int) -> Path:
    """A cache folder holding a valid entry whose pickle runs code, then given ``mode``."""
    folder.mkdir(mode=0o700)
    entry = DiskCache(folder).put("graph", KEY, {"artifact.pt": pickle.dumps(_Payload(marker))})
    os.chmod(folder, mode)
    return entry


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _load_like_the_graph_cache() -> None:
    """What kiln.cache does with a hit: unpickle its artifact."""
    hit = disk_cache.get("graph", KEY)
    if hit is not None:
        pickle.loads((hit / "artifact.pt").read_bytes())


def test_the_plant_runs_from_a_private_folder(tmp_path, monkeypatch):
    """The control: the same planted entry in a folder only its owner writes is a hit, and
    loading it runs its code (which is why the folder must be trusted)."""
    folder, marker = tmp_path / "cache", tmp_path / "ran"
    _planted_cache(folder, marker, 0o700)
    monkeypatch.setenv("KILN_CACHE_DIR", str(folder))
    _load_like_the_graph_cache()
    assert marker.exists()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702], ids=["world", "group", "others"])
def test_a_folder_others_can_write_is_refused_and_nothing_is_loaded(tmp_path, monkeypatch, mode):
    folder, marker = tmp_path / "shared", tmp_path / "ran"
    entry = _planted_cache(folder, marker, mode)
    monkeypatch.setenv("KILN_CACHE_DIR", str(folder))
    counters.clear()
    with pytest.warns(UnsafeCacheDirWarning) as record:
        _load_like_the_graph_cache()
    message = str(record[0].message)
    assert str(folder) in message and f"chmod 700 {folder}" in message
    assert "writable by" in message and "without the on-disk cache" in message
    assert not marker.exists()  # the planted pickle never ran
    assert counters["disk_cache_hits"] == 0
    # the compile still works: entries go to this process's own folder, not the refused one
    root = cache_dir()
    assert root != folder and _mode(root) == 0o700
    built = disk_cache.get_or_build("cpp", hash_key("k"), lambda tmp: (tmp / "kernel.so").write_bytes(b"x"))
    assert folder not in built.parents
    assert sorted(p.name for p in (folder / "graph").rglob("*")) == sorted(
        [entry.parent.name, entry.name, "artifact.pt", "MANIFEST.json"])  # left as it was
    assert _mode(folder) == mode  # kiln does not change a user's folder either


def test_the_warning_comes_once_per_folder(tmp_path, monkeypatch, recwarn):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    monkeypatch.setenv("KILN_CACHE_DIR", str(folder))
    for _ in range(3):
        assert disk_cache.get("graph", KEY) is None
    assert len([w for w in recwarn if w.category is UnsafeCacheDirWarning]) == 1


def test_a_folder_of_another_owner_is_refused(tmp_path, monkeypatch):
    """The machine runs as root, which owns every folder it makes: the check is told that
    this process is someone else."""
    folder, marker = tmp_path / "theirs", tmp_path / "ran"
    _planted_cache(folder, marker, 0o700)
    monkeypatch.setenv("KILN_CACHE_DIR", str(folder))
    monkeypatch.setattr(disk_cache, "_euid", lambda: os.stat(folder).st_uid + 1)
    with pytest.warns(UnsafeCacheDirWarning, match="belongs to another user"):
        _load_like_the_graph_cache()
    assert not marker.exists()
    with pytest.raises(UnsafeCacheDir, match=f"{folder}.*KILN_CACHE_DIR to a folder of your own"):
        check_cache_dir(folder)


def test_an_explicit_root_is_checked_the_same_way(tmp_path):
    folder, marker = tmp_path / "explicit", tmp_path / "ran"
    _planted_cache(folder, marker, 0o777)
    with pytest.warns(UnsafeCacheDirWarning, match="chmod 700"):
        assert DiskCache(folder).get("graph", KEY) is None
    assert not marker.exists()


def test_check_cache_dir_accepts_a_private_folder_and_names_the_fix(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o755)  # readable by others is fine: they cannot plant anything
    os.chmod(folder, 0o755)
    check_cache_dir(folder)
    os.chmod(folder, 0o775)
    with pytest.raises(UnsafeCacheDir) as e:
        check_cache_dir(folder)
    assert str(folder) in str(e.value) and f"`chmod 700 {folder}`" in str(e.value)
    assert "group" in str(e.value) and "775" in str(e.value)


def test_a_fresh_folder_and_the_parents_kiln_makes_are_0700(tmp_path, monkeypatch):
    folder = tmp_path / "a" / "b" / "kiln"
    monkeypatch.setenv("KILN_CACHE_DIR", str(folder))
    old = os.umask(0)  # the modes must not depend on the umask
    try:
        assert cache_dir() == folder
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", folder):
        assert _mode(p) == 0o700, p
    assert _mode(tmp_path) == stat.S_IMODE(os.stat(tmp_path).st_mode)  # not ours: untouched


def test_the_default_folder_is_made_private(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "kiln"
    assert _mode(tmp_path / ".cache") == 0o700 and _mode(tmp_path / ".cache" / "kiln") == 0o700
