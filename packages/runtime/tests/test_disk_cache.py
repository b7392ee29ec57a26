import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kiln_runtime
import pytest
from kiln_runtime import DiskCache, cache_dir, counters, disk_cache, hash_key


def test_cache_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "a"))
    assert cache_dir() == tmp_path / "a"
    assert (tmp_path / "a").is_dir()
    disk_cache.put("k", "key1", {"x.txt": "hello"})
    assert (tmp_path / "a" / "k").is_dir()
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "b"))
    assert cache_dir() == tmp_path / "b"
    assert disk_cache.get("k", "key1") is None  # a different cache


def test_cache_dir_default(monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "kiln"


def test_put_get_roundtrip_and_counters():
    counters.clear()
    key = hash_key("source", "flags")
    assert disk_cache.get("art", key) is None
    path = disk_cache.put("art", key, {"a.txt": "text", "b.bin": b"\x00\x01"})
    got = disk_cache.get("art", key)
    assert got == path
    assert (got / "a.txt").read_text() == "text"
    assert (got / "b.bin").read_bytes() == b"\x00\x01"
    assert counters["disk_cache_misses"] == 1
    assert counters["disk_cache_hits"] == 1


def test_hash_key_is_unambiguous():
    assert hash_key("ab", "c") != hash_key("a", "bc")
    assert hash_key("x") == hash_key(b"x")


@pytest.mark.parametrize("damage", ["truncate", "edit", "no_manifest", "bad_manifest", "missing_file"])
def test_corrupt_entry_is_rebuilt(damage):
    counters.clear()
    key = hash_key("k", damage)
    built = []

    def builder(tmp: Path):
        built.append(1)
        (tmp / "kernel.so").write_bytes(b"ELF" + b"x" * 100)

    path = disk_cache.get_or_build("so", key, builder)
    so = path / "kernel.so"
    if damage == "truncate":
        so.write_bytes(b"EL")
    elif damage == "edit":
        so.write_bytes(b"ELF" + b"y" * 100)
    elif damage == "no_manifest":
        (path / "MANIFEST.json").unlink()
    elif damage == "bad_manifest":
        (path / "MANIFEST.json").write_text("{not json")
    elif damage == "missing_file":
        so.unlink()
    path2 = disk_cache.get_or_build("so", key, builder)
    assert len(built) == 2
    assert counters["disk_cache_corrupt"] == 1
    assert (path2 / "kernel.so").read_bytes() == b"ELF" + b"x" * 100
    # and now it is a hit
    disk_cache.get_or_build("so", key, builder)
    assert len(built) == 2


def test_partial_temp_folder_is_invisible():
    key = hash_key("partial")

    def failing(tmp: Path):
        (tmp / "half.so").write_bytes(b"half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError):
        disk_cache.build("so", key, failing)
    assert disk_cache.get("so", key) is None
    leftovers = list(disk_cache.entry_dir("so", key).parent.iterdir())
    assert leftovers == []  # the temp folder was removed


def test_manifest_names_key():
    path = disk_cache.put("art", "abc123", {"f": "1"})
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["key"] == "abc123"
    # an entry copied under another key is not valid there
    other = disk_cache.entry_dir("art", "def456")
    other.parent.mkdir(parents=True, exist_ok=True)
    os.rename(path, other)
    assert disk_cache.get("art", "def456") is None


def test_concurrent_threads_same_key():
    key = hash_key("threads")
    start = threading.Barrier(16)

    def build_or_get(_):
        start.wait(30)  # the sixteen ask at once
        p = disk_cache.get_or_build("art", key, lambda tmp: (tmp / "v").write_text("same"))
        return (p / "v").read_text()

    with ThreadPoolExecutor(16) as pool:  # a thread's exception is raised here
        results = list(pool.map(build_or_get, range(16)))
    assert results == ["same"] * 16
    assert disk_cache.get("art", key) is not None
    # no stray temp folders
    assert [p.name for p in disk_cache.entry_dir("art", key).parent.iterdir()] == [key]


_WORKER = """
import sys
from kiln_runtime import DiskCache
cache = DiskCache(sys.argv[1])
for _ in range(5):
    p = cache.put("art", sys.argv[2], {"payload.bin": b"z" * 200_000})
    assert (p / "payload.bin").read_bytes() == b"z" * 200_000
"""


def test_concurrent_processes_same_key(tmp_path):
    root = tmp_path / "shared"
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(root), "k" * 8]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    cache = DiskCache(root)
    assert cache.get("art", "k" * 8) is not None
    assert [p.name for p in (root / "art" / "kk").iterdir()] == ["k" * 8]  # no leftovers


def test_bad_keys_rejected():
    with pytest.raises(ValueError):
        disk_cache.get("art", "../escape")
    with pytest.raises(ValueError):
        disk_cache.get("art", "")


def test_public_names():
    for name in ["cache_dir", "disk_cache", "load", "counters", "reinterpret_tensor", "empty_strided_cpu"]:
        assert hasattr(kiln_runtime, name)
