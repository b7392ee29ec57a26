"""On-disk artifact cache: a key maps to a folder of files.

Layout: ``<cache_dir()>/<kind>/<key[:2]>/<key>/`` holding the artifact's files and a
``MANIFEST.json`` (the key and the SHA-256 of every file). An entry is valid only when its
manifest parses, names this key and every listed file matches its hash; anything else (a
partial write from a killed process, a truncated or edited file) counts as ``corrupt``: it is
moved aside, deleted and rebuilt.

Writes are atomic: an entry is built in a private temporary folder next to its final place
and published with one ``os.rename``. Two processes building the same key both build; the
first rename wins and the loser uses the winner's entry (after checking it) and drops its
own. Readers never see a half-written entry under the final name.

Counters (``kiln_runtime.counters``): ``disk_cache_hits``, ``disk_cache_misses``,
``disk_cache_corrupt``, and the same per kind (``disk_cache_hits:graph``,
``disk_cache_misses:cpp``, ...). A corrupt entry is logged (logger ``kiln.cache``).

``touched()`` lists the (kind, key) entries this process read or wrote: ``pack(entries)``
turns them into one blob (a deployment ships it) and ``unpack(blob)`` installs a blob's
entries into this machine's cache (each checked against its manifest: that catches damage,
not malice; what a blob holds is code kiln runs).

**The folder is trusted like code.** Its entries are pickles loaded with
``torch.load(weights_only=False)`` and shared libraries loaded with ctypes, so whoever can
write the folder can run code in every process that uses it. As ssh treats a key file,
``cache_dir()`` refuses a folder owned by another user or writable by group or others (a
shared ``KILN_CACHE_DIR`` under /tmp): ``check_cache_dir`` raises ``UnsafeCacheDir`` naming
the folder and the fix (``chmod 700 <folder>``, or another folder). kiln then warns once
(``UnsafeCacheDirWarning``) and uses a fresh private folder for this process instead: nothing
is loaded from the refused folder, compiles still work, only without a warm cache (a warning,
not an error: torch.compile users expect a compile to work without its cache). Every reader
of the cache goes through ``cache_dir()`` (``DiskCache`` with an explicit root checks that
root the same way). Folders kiln creates (the cache folder and its missing parents) are
made 0700.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import io
import json
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import threading
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

from .counters import counters

MANIFEST = "MANIFEST.json"
_FORMAT = 1

log = logging.getLogger("kiln.cache")

#: (kind, key) of every entry this process read (a hit) or wrote, in first-seen order
_touched: dict[tuple[str, str], None] = {}


def _count(what: str, kind: str) -> None:
    counters[f"disk_cache_{what}"] += 1
    counters[f"disk_cache_{what}:{kind}"] += 1


class UnsafeCacheDir(PermissionError):
    """A cache folder others could write: kiln loads nothing from it."""


class UnsafeCacheDirWarning(UserWarning):
    """kiln refused its cache folder and compiles without the on-disk cache."""


def _euid() -> int:
    return os.geteuid()


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each 0700 (``mkdir -p`` would give the
    parents the umask's mode)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:  # another process made it: check_cache_dir judges it
            continue
        os.chmod(p, 0o700)  # whatever the umask


def check_cache_dir(path: Path) -> None:
    """Raise ``UnsafeCacheDir`` unless ``path`` is a folder owned by this user that neither
    group nor others can write (ssh's rule for key files)."""
    st = os.stat(path)  # follows a symlink: the folder it names is judged
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDir(f"kiln's cache folder {path} is not a folder")
    if st.st_uid != _euid():
        raise UnsafeCacheDir(
            f"kiln's cache folder {path} belongs to another user (uid {st.st_uid}; you are uid "
            f"{_euid()}), who could put code in it that kiln would run. Set KILN_CACHE_DIR to a "
            "folder of your own.")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                           if st.st_mode & bit)
        raise UnsafeCacheDir(
            f"kiln's cache folder {path} is writable by {who} (mode "
            f"{stat.S_IMODE(st.st_mode):o}), who could put code in it that kiln would run. "
            f"Fix: `chmod 700 {path}`, or set KILN_CACHE_DIR to a folder of your own.")


_refused: set[str] = set()
_private: Path | None = None
_private_lock = threading.Lock()


def _private_dir() -> Path:
    """This process's own cache folder (0700, removed at exit), used instead of a refused one."""
    global _private
    with _private_lock:
        if _private is None:
            _private = Path(tempfile.mkdtemp(prefix="kiln-cache-"))
            atexit.register(shutil.rmtree, _private, True)
        return _private


def safe_root(root: Path) -> Path:
    """``root`` (created 0700 when missing) if ``check_cache_dir`` accepts it; else, after one
    warning per folder, this process's private folder: nothing is read from ``root``."""
    try:
        make_private_dirs(root)
        check_cache_dir(root)
        return root
    except OSError as e:  # UnsafeCacheDir, or a folder we cannot make or stat
        if str(root) not in _refused:
            _refused.add(str(root))
            msg = str(e) if isinstance(e, UnsafeCacheDir) else f"kiln's cache folder {root}: {e}"
            warnings.warn(f"{msg} This process compiles without the on-disk cache.",
                          UnsafeCacheDirWarning, stacklevel=3)
            log.warning("kiln: %s This process compiles without the on-disk cache.", msg)
        return _private_dir()


def cache_dir() -> Path:
    """The root of kiln's caches: ``$KILN_CACHE_DIR`` or ``~/.cache/kiln`` (created 0700 on
    use), or, when that folder is refused (``check_cache_dir``), this process's private one."""
    env = os.environ.get("KILN_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "kiln"
    return safe_root(root)


def hash_key(*parts: str | bytes) -> str:
    """A cache key: SHA-256 over the parts (each length-prefixed, so ("ab","c") != ("a","bc"))."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_key(key: str) -> None:
    if not key or "/" in key or key.startswith(".") or "\0" in key:
        raise ValueError(f"bad cache key {key!r}")


class DiskCache:
    """Artifacts by (kind, key). ``root=None`` follows ``cache_dir()`` at each call."""

    def __init__(self, root: str | os.PathLike | None = None):
        self._root = Path(root) if root is not None else None

    @property
    def root(self) -> Path:
        if self._root is None:
            return cache_dir()
        return safe_root(self._root)

    def entry_dir(self, kind: str, key: str) -> Path:
        _check_key(kind)
        _check_key(key)
        return self.root / kind / key[:2] / key

    # -- reading -----------------------------------------------------------------------
    def _valid(self, path: Path, key: str) -> bool:
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            if manifest.get("format") != _FORMAT or manifest.get("key") != key:
                return False
            files = manifest["files"]
            return all(_file_sha(path / name) == sha for name, sha in files.items())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False

    def get(self, kind: str, key: str) -> Path | None:
        """The entry's folder if a valid entry exists (a hit), else None (a miss).

        A corrupt entry is removed, so the caller rebuilds it."""
        path = self.entry_dir(kind, key)
        if not path.exists():
            _count("misses", kind)
            return None
        if self._valid(path, key):
            _count("hits", kind)
            _touched[(kind, key)] = None
            return path
        _count("corrupt", kind)
        _count("misses", kind)
        log.warning("kiln: corrupt %s cache entry %s ignored; it is rebuilt", kind, path)
        self._discard(path)
        return None

    # -- writing -----------------------------------------------------------------------
    def _discard(self, path: Path) -> None:
        """Move ``path`` out of the way atomically, then delete it."""
        trash = path.with_name(f".trash-{path.name}-{uuid.uuid4().hex}")
        try:
            os.rename(path, trash)
        except OSError:
            return  # someone else moved it already
        shutil.rmtree(trash, ignore_errors=True)

    def _publish(self, tmp: Path, final: Path, key: str) -> Path:
        """Rename ``tmp`` to ``final``; if another writer won, use theirs when it is valid."""
        for _ in range(3):
            try:
                os.rename(tmp, final)
                return final
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                    raise
            if self._valid(final, key):
                shutil.rmtree(tmp, ignore_errors=True)
                return final
            self._discard(final)  # a corrupt entry sits there: replace it
        raise OSError(f"could not publish cache entry {final}")

    def build(self, kind: str, key: str, builder: Callable[[Path], None]) -> Path:
        """Run ``builder(tmp_folder)`` (it writes the artifact's files there), then publish."""
        final = self.entry_dir(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=final.parent))
        try:
            builder(tmp)
            files = {
                p.name: _file_sha(p) for p in sorted(tmp.iterdir()) if p.is_file() and p.name != MANIFEST
            }
            manifest = {"format": _FORMAT, "key": key, "files": files}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            published = self._publish(tmp, final, key)
            _touched[(kind, key)] = None
            return published
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def put(self, kind: str, key: str, files: Mapping[str, str | bytes]) -> Path:
        """Store ``files`` (name -> text or bytes) under (kind, key); returns the entry folder."""

        def write(tmp: Path) -> None:
            for name, data in files.items():
                if "/" in name or name == MANIFEST:
                    raise ValueError(f"bad artifact file name {name!r}")
                mode = "wb" if isinstance(data, bytes) else "w"
                with open(tmp / name, mode) as f:
                    f.write(data)

        return self.build(kind, key, write)

    def get_or_build(self, kind: str, key: str, builder: Callable[[Path], None]) -> Path:
        """The valid entry for (kind, key), building it with ``builder(tmp)`` on a miss."""
        hit = self.get(kind, key)
        if hit is not None:
            return hit
        return self.build(kind, key, builder)

    def discard(self, kind: str, key: str) -> None:
        """Remove one entry (a stale one its reader could not use), so it is rebuilt."""
        path = self.entry_dir(kind, key)
        if path.exists():
            self._discard(path)

    def clear(self, kind: str | None = None) -> None:
        """Delete every entry (of one kind, or all)."""
        target = self.root / kind if kind else self.root
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)


    # -- shipping entries ------------------------------------------------------------
    def pack(self, entries) -> bytes:
        """One blob (an uncompressed tar) holding the given (kind, key) entries that are
        valid here; the others are skipped."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for kind, key in entries:
                path = self.entry_dir(kind, key)
                if not path.exists() or not self._valid(path, key):
                    continue
                for f in sorted(path.iterdir()):
                    if f.is_file():
                        tar.add(str(f), arcname=f"{kind}/{key}/{f.name}", recursive=False)
        return buf.getvalue()

    def unpack(self, blob: bytes) -> list[tuple[str, str]]:
        """Install the entries of a ``pack`` blob; returns the (kind, key) installed. An entry
        already valid here is kept; one whose files fail its manifest is dropped (logged)."""
        by_entry: dict[tuple[str, str], dict[str, bytes]] = {}
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
            for member in tar.getmembers():
                parts = member.name.split("/")
                if not member.isfile() or len(parts) != 3:
                    raise ValueError(f"not a kiln cache blob (member {member.name!r})")
                kind, key, name = parts
                _check_key(kind)
                _check_key(key)
                _check_key(name)
                data = tar.extractfile(member)
                by_entry.setdefault((kind, key), {})[name] = data.read() if data else b""
        installed = []
        for (kind, key), files in by_entry.items():
            final = self.entry_dir(kind, key)
            if final.exists() and self._valid(final, key):
                installed.append((kind, key))
                continue

            def write(tmp: Path, files=files) -> None:
                for name, data in files.items():
                    (tmp / name).write_bytes(data)

            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=final.parent))
            try:
                write(tmp)
                if not self._valid(tmp, key):
                    log.warning("kiln: cache blob entry %s/%s fails its manifest; skipped", kind, key)
                    shutil.rmtree(tmp, ignore_errors=True)
                    continue
                self._publish(tmp, final, key)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            installed.append((kind, key))
        return installed


def touched() -> list[tuple[str, str]]:
    """(kind, key) of every entry this process hit or wrote, first seen first."""
    return list(_touched)


_default = DiskCache()


def get(kind: str, key: str) -> Path | None:
    return _default.get(kind, key)


def put(kind: str, key: str, files: Mapping[str, str | bytes]) -> Path:
    return _default.put(kind, key, files)


def build(kind: str, key: str, builder: Callable[[Path], None]) -> Path:
    return _default.build(kind, key, builder)


def get_or_build(kind: str, key: str, builder: Callable[[Path], None]) -> Path:
    return _default.get_or_build(kind, key, builder)


def entry_dir(kind: str, key: str) -> Path:
    return _default.entry_dir(kind, key)


def clear(kind: str | None = None) -> None:
    _default.clear(kind)


def discard(kind: str, key: str) -> None:
    _default.discard(kind, key)


def pack(entries) -> bytes:
    return _default.pack(entries)


def unpack(blob: bytes) -> list[tuple[str, str]]:
    return _default.unpack(blob)
