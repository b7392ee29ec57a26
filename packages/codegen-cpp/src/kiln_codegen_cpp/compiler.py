"""The C++ compiler driver: source -> cached shared object -> ctypes function.

One ``g++`` process per kernel, run from a thread pool (``max_workers = os.cpu_count()``):
kernels compile in parallel, and each kernel is its own cache entry, so a graph that shares a
kernel with an earlier one (or a second process) skips that compile. A kernel's source is small
(the prelude is ~150 lines of plain C++ over ``<math.h>``), so a g++ run costs ~0.2-0.4 s.

Cache key = sha256(source, flags, compiler version); the entry (kind ``cpp``) holds
``kernel.cpp`` and ``kernel.so`` (see kiln_runtime.disk_cache: atomic, corrupt entries
rebuilt). A compile error raises ``CppCompileError`` naming the kernel source path (kept in
``<cache_dir>/cpp-errors/``) and the compiler's message.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kiln_runtime import cache_dir, counters, disk_cache, hash_key


def compiler() -> str:
    """The C++ compiler: ``$KILN_CXX``, else ``$CXX``, else ``g++``."""
    return os.environ.get("KILN_CXX") or os.environ.get("CXX") or "g++"


#: every flag in one place. -fno-math-errno lets libm calls vectorize (errno is never read);
#: -fno-trapping-math lets GCC if-convert floating selects (FP exceptions are never enabled).
#: -fno-tree-sink keeps every load where the kernel wrote it, unconditional: kernels index
#: in bounds and load before selecting (``where``), but GCC's sink pass moves a load used by
#: one arm of ``c ? 0 : load`` into that arm, if-conversion then makes it a masked load, and
#: GCC 12.2's vectorizer drops the permutation of a group of masked loads (GCC PR 114375):
#: a fully unrolled 7-wide row (resnet18's 7x7 planes at 224x224) loaded every vector under
#: its first vector's mask, and the relu backward read zeros and stale memory.
#: No -ffast-math: NaN/inf and rounding must stay IEEE (torch's semantics).
CXXFLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fno-tree-sink",
    "-std=c++17",
    "-w",
)


class CppCompileError(RuntimeError):
    """g++ failed; ``.source_path`` is the kernel's C++ file, ``.stderr`` the compiler output."""

    def __init__(self, name: str, source_path: Path, stderr: str, cmd: list[str]):
        self.kernel_name = name
        self.source_path = source_path
        self.stderr = stderr
        self.cmd = cmd
        lines = stderr.strip().splitlines()
        head = "\n".join(lines[:20]) + ("\n..." if len(lines) > 20 else "")
        super().__init__(
            f"C++ compile of kernel {name} failed (source: {source_path})\n"
            f"command: {' '.join(cmd)}\n{head}"
        )


@functools.lru_cache(None)
def compiler_version(cxx: str | None = None) -> str:
    """First line of ``<cxx> --version`` plus the machine's ISA flags (for -march=native).

    The first line is remembered under the cache folder, keyed by the compiler binary's
    resolved path, size, inode and modification time (an upgraded compiler is a new binary):
    a warm process skips the subprocess (tens of ms on a graph-cache hit)."""
    cxx = cxx or compiler()
    memo = _version_memo(cxx)
    if memo is not None:
        try:
            return memo.read_text().strip() + "|" + _cpu_flags()
        except OSError:
            pass
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"no working C++ compiler {cxx!r} ({e}); set KILN_CXX") from e
    first = out.splitlines()[0]
    if memo is not None and first.strip():
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_name(f"{memo.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(first)
            os.replace(tmp, memo)
        except OSError:
            pass
    return first + "|" + _cpu_flags()


def _version_memo(cxx: str) -> Path | None:
    """Where ``cxx``'s version line is remembered (None: the binary cannot be found)."""
    found = shutil.which(cxx)
    if found is None:
        return None
    try:
        real = os.path.realpath(found)
        st = os.stat(real)
    except OSError:
        return None
    key = hash_key(real, str(st.st_size), str(st.st_ino), str(st.st_mtime_ns))
    return cache_dir() / "cxx-version" / key[:32]


@functools.lru_cache(None)
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return hash_key(line)[:16]
    except OSError:
        pass
    return "unknown-cpu"


def cache_key(source: str, flags: tuple[str, ...] = CXXFLAGS) -> str:
    cxx = compiler()
    return hash_key(source, " ".join(flags), cxx, compiler_version(cxx))


def _compile_into(name: str, source: str, flags: tuple[str, ...], folder: Path) -> None:
    src = folder / "kernel.cpp"
    src.write_text(source)
    cmd = [compiler(), *flags, str(src), "-o", str(folder / "kernel.so")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    counters["cpp_compiles"] += 1
    if proc.returncode != 0:
        # keep the failing source where the user can read it (the temp folder is deleted)
        err_dir = cache_dir() / "cpp-errors"
        err_dir.mkdir(parents=True, exist_ok=True)
        kept = err_dir / f"{name}-{hash_key(source)[:12]}.cpp"
        shutil.copyfile(src, kept)
        stderr = proc.stderr.replace(str(src), str(kept))
        kept.with_suffix(".log").write_text(stderr)
        cmd[-3] = str(kept)
        cmd[-1] = "kernel.so"
        raise CppCompileError(name, kept, stderr, cmd)


def compile_source(name: str, source: str, flags: tuple[str, ...] = CXXFLAGS) -> Path:
    """Path of the shared object built from ``source`` (cached on disk)."""
    key = cache_key(source, flags)
    entry = disk_cache.get_or_build("cpp", key, lambda tmp: _compile_into(name, source, flags, tmp))
    return entry / "kernel.so"


def compile_many(sources: Mapping[str, str], flags: tuple[str, ...] = CXXFLAGS) -> dict[str, Path]:
    """Compile several kernels at once (one g++ each, in parallel); name -> .so path.

    If any fail, the first ``CppCompileError`` (in the given order) is raised after all ran."""
    names = list(sources)
    if len(names) <= 1:
        return {n: compile_source(n, sources[n], flags) for n in names}
    workers = min(len(names), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kiln-g++") as pool:
        futures = {n: pool.submit(compile_source, n, sources[n], flags) for n in names}
        results, error = {}, None
        for n in names:
            try:
                results[n] = futures[n].result()
            except CppCompileError as e:
                error = error or e
    if error is not None:
        raise error
    return results


_libs: dict[str, ctypes.CDLL] = {}
_libs_lock = threading.Lock()


def load_library(path: Path, num_threads: int | None = None) -> ctypes.CDLL:
    """dlopen a kernel's shared object once per process (and set its thread count)."""
    key = str(path)
    with _libs_lock:
        lib = _libs.get(key)
        if lib is None:
            lib = ctypes.CDLL(key)
            _libs[key] = lib
    if num_threads is not None:
        lib.kiln_set_num_threads(ctypes.c_int(num_threads))
    return lib


def kernel_function(path: Path, symbol: str, argtypes: list, num_threads: int | None = None):
    """The ``extern "C"`` function ``symbol`` of the shared object, with ctypes argtypes set."""
    lib = load_library(path, num_threads)
    fn = getattr(lib, symbol)
    fn.argtypes = argtypes
    fn.restype = None
    return fn


def vectorization_report(source: str, flags: tuple[str, ...] = CXXFLAGS) -> list[int]:
    """Source line numbers of the loops GCC vectorized (``-fopt-info-vec-optimized``); for
    tests and for checking a kernel by hand. Not cached."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kiln-vec-") as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        cflags = [f for f in flags if f not in ("-shared", "-w")]
        cmd = [compiler(), *cflags, "-c", str(src), "-o", str(Path(tmp) / "kernel.o"),
               "-fopt-info-vec-optimized"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CppCompileError("vectorization_report", src, proc.stderr, cmd)
    lines = set()
    for m in re.finditer(r"kernel\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr):
        lines.add(int(m.group(1)))
    return sorted(lines)


def masked_memory_ops(source: str, flags: tuple[str, ...] = CXXFLAGS) -> int:
    """How many masked loads and stores GCC's loop if-conversion made of ``source`` (its
    ``.MASK_LOAD``/``.MASK_STORE`` calls). Kernels load in bounds and unconditionally, so
    this is 0 unless a pass made a load conditional (see ``-fno-tree-sink`` at CXXFLAGS);
    for tests. Not cached."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kiln-ifcvt-") as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        dump = Path(tmp) / "kernel.ifcvt"
        cflags = [f for f in flags if f not in ("-shared", "-w")]
        cmd = [compiler(), *cflags, "-c", str(src), "-o", str(Path(tmp) / "kernel.o"),
               f"-fdump-tree-ifcvt={dump}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CppCompileError("masked_memory_ops", src, proc.stderr, cmd)
        text = dump.read_text() if dump.exists() else ""
    return text.count(".MASK_LOAD (") + text.count(".MASK_STORE (")


def vectorized_loops(source: str, flags: tuple[str, ...] = CXXFLAGS) -> list[str]:
    """The header lines (``for (...)``, stripped) of the loops GCC vectorized in ``source``."""
    lines = source.splitlines()
    found: dict[int, str] = {}  # loop header line -> text (one entry per loop)
    for ln in vectorization_report(source, flags):
        k = ln - 1
        indent = len(lines[k]) - len(lines[k].lstrip())
        while k >= 0:
            text = lines[k].lstrip()
            cur = len(lines[k]) - len(text)
            if text.startswith("for (") and (k == ln - 1 or cur < indent):
                break
            k -= 1
        if k >= 0:
            found[k] = lines[k].strip()
    return [found[k] for k in sorted(found)]
