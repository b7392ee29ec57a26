"""Compiling Triton kernels in worker processes (cold compile time).

Triton's compile holds the GIL for much of its Python work (the MLIR pipeline driver, the
binder, the cache), so compile threads in one process overlap little. Worker processes
compile each (kernel, config) on placeholder arguments, which writes the binary to Triton's
on-disk cache; the parent's own warm-up of that pair then only loads it from there.

- ``start()`` starts the workers, ``python .../compile_workers.py`` subprocesses fed jobs
  (plain tuples, pickled) over their pipes (multiprocessing's spawned children would re-run
  the user's main script); importing torch and triton takes them seconds. The
  launcher calls it for a graph with at least ``MIN_JOBS`` kernel x config pairs (a model, not
  a small test graph: each worker holds a CUDA context). The pool then stays for later graphs.
- ``submit(job)`` returns a future (None: no pool, or its workers are still starting:
  compile in-process). Jobs are offered one at a time, so a graph whose compile starts before
  the workers are up moves its remaining jobs to them as they come up.
- ``compile_job(job)`` is what a worker runs; it runs in-process too (tests, no pool).
- ``captured_compile(fn, launch)``: what Triton's JIT would compile for a launch (the
  ``ASTSource`` arguments, target and options), taken in the parent without compiling. A job
  that carries them compiles with ``triton.compile`` alone: its worker needs no torch and no
  CUDA context, so it is up in well under a second (importing torch took 3.7-4.3 s on the
  H200's host) and the first model's compiles find the workers ready. The parent's own
  warm-up then finds the binary under the same cache key. A job without them (another
  Triton, whose JIT this cannot follow) compiles as before, on placeholder tensors.

A failure here only costs time: the parent then compiles the pair itself, and a real
compile error is reported by its launch as before. ``KILN_TRITON_COMPILE_WORKERS=N`` sets
the pool size (0 or 1: no pool; default: the CPU count, at most 8 and at most one per 8 GiB
of GPU memory). Never under the interpreter.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass

log = logging.getLogger("kiln")


@dataclass(frozen=True)
class CompileJob:
    """One kernel x config to compile: the kernel's source file, each argument as ``"int"``
    (its example value in ``ints``) or a dtype name (a 16-element placeholder tensor on
    ``device``), the config (block sizes, ``num_warps``/``num_stages``)."""

    path: str
    arg_types: tuple[str, ...]
    ints: tuple[int, ...]
    config: tuple[tuple[str, int], ...]
    device: str = "cuda"
    #: the module's kernels to compile (a split reduction has a final kernel too)
    kernels: tuple[str, ...] = ("kiln_kernel",)
    #: per kernel, ``captured_compile``'s (signature, constexprs, attrs, target, options,
    #: backend hash), or
    #: None: then the kernels compile through ``warmup`` on placeholder tensors
    captured: tuple | None = None

    def __str__(self) -> str:
        return f"CompileJob({os.path.basename(os.path.dirname(self.path))} {dict(self.config)})"


def job_for(path: str, arg_types: list, hints: list[int], config: dict, device: str = "cuda",
            kernels: tuple[str, ...] = ("kiln_kernel",), captured: tuple | None = None) -> CompileJob:
    """A picklable job from a launcher's argument dtypes (``"int"`` or ``torch.dtype``)."""
    types = tuple("int" if t == "int" else str(t).removeprefix("torch.") for t in arg_types)
    return CompileJob(path, types, tuple(int(h) for h in hints), tuple(sorted(config.items())), device,
                      tuple(kernels), captured)


class _Captured(Exception):
    """Raised in place of Triton's compile once its arguments are taken."""


_CAPTURE_LOCK = threading.Lock()


def captured_compile(fn, launch) -> tuple | None:
    """(signature, constexprs, attrs, target, options, backend hash): the arguments Triton's
    JIT gives its ``ASTSource`` and ``compile`` when ``launch()`` (a ``fn.warmup(...)``) needs
    ``fn`` compiled, taken without compiling, and this process's hash of the backend (see
    ``_compile_keyed_as_parent``); None when nothing needs compiling (already in this
    process) or this Triton's JIT does not build them as expected (``create_binder`` sets
    ``fn.compile`` and ``fn.ASTSource``, Triton 3.x). Other threads using ``fn`` meanwhile
    compile as usual."""
    with _CAPTURE_LOCK:
        caches = getattr(fn, "device_caches", None)
        if caches is None:
            return None
        try:
            import torch

            caches[torch.cuda.current_device()]  # builds the binder: sets fn.compile, fn.ASTSource
        except Exception:  # noqa: BLE001
            return None
        if "compile" not in vars(fn) or "ASTSource" not in vars(fn):
            return None
        real_compile, real_source = fn.compile, fn.ASTSource
        owner, seen = threading.get_ident(), {}

        def ast_source(f, signature, constexprs=None, attrs=None):
            if threading.get_ident() == owner:
                seen["source"] = (signature, constexprs, attrs)
            return real_source(f, signature, constexprs, attrs)

        def compile_args(src, target=None, options=None, **kw):
            if threading.get_ident() != owner:
                return real_compile(src, target=target, options=options, **kw)
            seen["compile"] = (target, options)
            raise _Captured

        fn.compile, fn.ASTSource = compile_args, ast_source
        try:
            launch()
        except _Captured:
            pass
        except Exception:  # noqa: BLE001  (the real launch reports it)
            return None
        finally:
            fn.compile, fn.ASTSource = real_compile, real_source
        if "source" not in seen or "compile" not in seen:
            return None
        try:
            from triton.compiler.compiler import make_backend

            captured = (*seen["source"], *seen["compile"], make_backend(seen["compile"][0]).hash())
            pickle.dumps(captured)
        except Exception:  # noqa: BLE001
            return None
        return captured


#: a graph with fewer kernel x config pairs than this compiles in-process only
MIN_JOBS = 16

_MODULES: dict[str, object] = {}  # source path -> its imported module


def _module(path: str):
    """The kernel source file at ``path``, imported once per process."""
    module = _MODULES.get(path)
    if module is None:
        spec = importlib.util.spec_from_file_location(f"kiln_triton_worker_{len(_MODULES)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[path] = module
    return module


def compile_job(job: CompileJob) -> str | None:
    """Compile one job with Triton's ``warmup`` (fills Triton's cache); returns None, or the
    error's text (the parent compiles that pair itself and reports a real error)."""
    try:
        module = _module(job.path)
        if job.captured is not None:  # triton.compile alone: no torch, no CUDA context
            from triton.compiler import ASTSource

            for name, captured in zip(job.kernels, job.captured, strict=True):
                if captured is not None:
                    signature, constexprs, attrs, target, options, backend_hash = captured
                    _build_launcher(_compile_keyed_as_parent(
                        ASTSource(getattr(module, name), signature, constexprs, attrs), target, options, backend_hash))
            return None
        import torch

        ints = iter(job.ints)
        args = [next(ints) if t == "int" else torch.empty(16, dtype=getattr(torch, t), device=job.device)
                for t in job.arg_types]
        config = dict(job.config)
        meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
        opts = {k: v for k, v in config.items() if k in ("num_warps", "num_stages")}
        for name in job.kernels:
            load_handles(getattr(module, name).warmup(*args, grid=(1,), **meta, **opts))
        return None
    except Exception as e:  # noqa: BLE001  (reported by the parent's own compile)
        return f"{type(e).__name__}: {e}"


def _compile_keyed_as_parent(source, target, options, backend_hash: str):
    """``triton.compile``, with the backend's part of the cache key taken from the parent.
    Triton reads its ptxas's version once per process (``get_ptxas_version`` is cached) but
    the ptxas path (``TRITON_PTXAS_PATH``) at each compile, and torch.compile sets that path
    to torch's own ptxas: a parent that compiled a kernel before torch.compile ran keys its
    cache by Triton's ptxas, a worker started after by torch's. On the H200 the parent then
    found none of the workers' binaries and compiled all 17 of resnet50's kernels again
    (1.1-1.9 s each, in its threads). Keyed as the parent keys it, the binary is the one the
    parent would build (its compile, too, runs the ptxas the path names)."""
    from triton.compiler import compiler

    make_backend = compiler.make_backend

    def parents_backend(target):
        backend = make_backend(target)
        backend.hash = lambda: backend_hash
        return backend

    compiler.make_backend = parents_backend  # (a worker compiles one job at a time)
    try:
        return compiler.compile(source, target=target, options=options)
    finally:
        compiler.make_backend = make_backend


def _build_launcher(kernel) -> None:
    """Build the kernel signature's C launcher here, without torch: Triton 3.6 compiles one
    per signature with gcc (0.3-1.4 s, cached on disk), which the parent's first load of the
    kernel did in turn otherwise (2.8 s of resnet50's cold compile). Best effort: a Triton
    whose launcher needs its driver (and so torch) or has none per signature is left alone."""
    launcher = _torch_free_launcher()
    if launcher is not None:
        try:
            launcher(kernel.src, kernel.metadata)
        except Exception:  # noqa: BLE001  (the parent builds it at its first load)
            pass


@functools.cache
def _torch_free_launcher():
    """Triton's CUDA launcher class when building one needs no driver (read once), else None."""
    try:
        import inspect

        from triton.backends.nvidia.driver import CudaLauncher

        return None if "driver.active" in inspect.getsource(CudaLauncher.__init__) else CudaLauncher
    except Exception:  # noqa: BLE001
        return None


def load_handles(kernel) -> None:
    """Load a compiled kernel as its first launch would: Triton builds a C launcher per
    kernel signature there (a gcc run, about 0.3 s, cached on disk by its source), which a
    worker does in parallel with the others instead of the first call doing it in turn."""
    init = getattr(kernel, "_init_handles", None)
    if init is not None:
        init()


def _worker_ready() -> int:
    """Run once per worker at start: import what a compile needs (torch, for a job without
    captured arguments, is imported by that job)."""
    import triton.compiler  # noqa: F401

    return os.getpid()


# ------------------------------------------------------------------------------ the pool
# Worker processes are this file run as a script (``python compile_workers.py``), not
# multiprocessing's children: a spawned multiprocessing child re-runs the user's main script.


def _job_fields(job: CompileJob) -> tuple:
    """A job as its worker reads it (``CompileJob(*fields)``): plain data, the worker imports
    no kiln; the fields taken as they are (``dataclasses.astuple`` would turn a captured
    GPUTarget into a tuple)."""
    return tuple(getattr(job, f.name) for f in dataclasses.fields(job))


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("compile worker closed its pipe")
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(n))


class _Pool:
    """``n`` worker processes, each served by one thread of this process that hands it jobs
    from a shared queue. A worker that dies marks the pool broken (its queued jobs fail: their
    pairs compile in-process)."""

    def __init__(self, n: int):
        self.jobs: queue.Queue = queue.Queue()
        self.ready = [Future() for _ in range(n)]
        self.broken = False
        self.owner = os.getpid()  # a forked child has the object but not the serving threads
        self.procs: list = []
        self.warm_up = _warm_up_target()  # (the workers' argv)
        for i in range(n):
            threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"kiln-compile-{i}").start()

    def _serve(self, i: int) -> None:
        try:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *self.warm_up],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            self.ready[i].set_result(_receive(proc.stdout))
        except Exception as e:  # noqa: BLE001
            self.ready[i].set_exception(e)
            self._break()
            return
        while True:
            item = self.jobs.get()
            if item is None:
                break
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                _send(proc.stdin, _job_fields(job))
                future.set_result(_receive(proc.stdout))
            except Exception as e:  # noqa: BLE001  (a dead worker)
                future.set_exception(e)
                self._break()
                break
        try:
            proc.stdin.close()
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            proc.kill()

    def _break(self) -> None:
        self.broken = True
        while True:
            try:
                item = self.jobs.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_exception(RuntimeError("compile workers broken"))

    def submit(self, job: CompileJob) -> Future:
        future: Future = Future()
        self.jobs.put((job, future))
        if self.broken:
            self._break()
        return future

    def shutdown(self) -> None:
        for _ in self.ready:
            self.jobs.put(None)


_POOL: list = []  # [_Pool] once started
_LOCK = threading.Lock()


def ready() -> bool:
    """The pool is there, not broken, and at least half its workers have started (starting
    one imports torch and triton: seconds; until then compiling in-process is faster than
    waiting)."""
    if not _POOL or _POOL[0].broken or _POOL[0].owner != os.getpid():
        return False
    up = sum(f.done() and f.exception() is None for f in _POOL[0].ready)
    return up >= max(1, len(_POOL[0].ready) // 2)


#: GPU memory per worker the default pool size allows for (its CUDA context is ~0.5 GiB)
GIB_PER_WORKER = 8


def pool_size() -> int:
    """``KILN_TRITON_COMPILE_WORKERS``, else one worker per CPU, at most 8 (16 started slower
    on the H200's 16-core host: resnet50's kernel compile 2.8-3.3 s -> 4.7 s), and at most one
    per ``GIB_PER_WORKER`` GiB of the GPU's memory (each worker holds a CUDA context)."""
    v = os.environ.get("KILN_TRITON_COMPILE_WORKERS")
    if v is not None:
        return max(0, int(v))
    n = min(8, os.cpu_count() or 1)
    try:
        import torch

        if torch.cuda.is_available():
            gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
            n = min(n, max(1, int(gib // GIB_PER_WORKER)))
    except Exception:  # noqa: BLE001  (no CUDA here: the CPU count decides)
        pass
    return n


def start() -> None:
    """Start the worker processes (returns at once). Idempotent; a no-op with a pool size
    below 2."""
    n = pool_size()
    if n < 2:
        return
    with _LOCK:
        if not _POOL:
            _POOL.append(_Pool(n))


def submit(job: CompileJob) -> Future | None:
    """A future for the job (its result: ``compile_job``'s), or None without a ready pool."""
    if not ready():
        return None
    return _POOL[0].submit(job)


#: seconds to wait for one job before compiling the pair in-process instead
JOB_TIMEOUT_S = 120


def wait(future: Future | None) -> None:
    """Wait for a job; its failure is only logged (the caller compiles the pair itself)."""
    if future is None:
        return
    try:
        error = future.result(timeout=JOB_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001  (a dead worker, a timeout)
        error = f"{type(e).__name__}: {e}"
    if error:
        log.debug("kiln: Triton compile worker: %s", error)


def shutdown() -> None:
    with _LOCK:
        while _POOL:
            _POOL.pop().shutdown()


_PARENT_WARM = []  # [thread] once warm_up_parent started


def warm_up_parent() -> None:
    """Fill, in a background thread, the once-per-process Triton state this process's first
    kernel load waits for, while the graph is still being traced: the driver (a fresh Triton
    cache builds its C utilities with gcc), the hash of Triton's own sources and ``libtriton``
    (part of every cache key: the parent's loads of the workers' binaries computed it at once,
    in every thread, 0.45 s each on the H200's host), and the backend's (``ptxas --version``).
    Idempotent; best effort: anything missing here is computed at the first load as before."""
    with _LOCK:
        if _PARENT_WARM:
            return
        thread = threading.Thread(target=_warm_parent_state, daemon=True, name="kiln-triton-warm-up")
        _PARENT_WARM.append(thread)
    thread.start()


def _warm_parent_state() -> None:
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime import driver

        backend = make_backend(driver.active.get_current_target())
        _triton_key()()
        backend.hash()
    except Exception as e:  # noqa: BLE001
        log.debug("kiln: Triton warm-up skipped: %s: %s", type(e).__name__, e)


def _triton_key():
    """Triton's cached hash of its installation (``triton_key``; moved between versions)."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        from triton.compiler.compiler import triton_key
    return triton_key


def _warm_up_target() -> list[str]:
    """``[backend, arch, warp size]`` of the current CUDA device for a worker's warm-up
    compile (``_warm_up``), or nothing."""
    try:
        import torch

        if torch.cuda.is_available() and torch.version.hip is None:
            major, minor = torch.cuda.get_device_capability()
            return ["cuda", str(major * 10 + minor), "32"]
    except Exception:  # noqa: BLE001
        pass
    return []


_WARM_UP_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def kiln_warm_up(x, n, XBLOCK: tl.constexpr):
    o = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(x + o, tl.exp(tl.load(x + o, o < n)), o < n)
"""


def _warm_up(target: list[str]) -> None:
    """Compile a tiny kernel for ``target``: a process's first Triton compile also loads the
    backend and its tools, which would otherwise add to the first real job, while the
    parent is still tracing. Best effort."""
    try:
        import tempfile

        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, compile

        path = os.path.join(tempfile.mkdtemp(prefix="kiln-warm-up-"), "kiln_warm_up.py")
        with open(path, "w") as f:
            f.write(_WARM_UP_KERNEL)
        compile(ASTSource(_module(path).kiln_warm_up, {"x": "*fp32", "n": "i32", "XBLOCK": "constexpr"}, {(2,): 128}),
                target=GPUTarget(target[0], int(target[1]), int(target[2])))
    except Exception:  # noqa: BLE001
        pass


def _main() -> None:
    """A worker: say it is ready, warm up, then compile jobs from stdin until it closes."""
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    sys.stdout = sys.stderr  # prints of imported code must not mix into the replies
    _send(out, _worker_ready())
    if len(sys.argv) == 4:
        _warm_up(sys.argv[1:])
    while True:
        try:
            job = CompileJob(*_receive(inp))
        except EOFError:
            return
        _send(out, compile_job(job))


if __name__ == "__main__":  # run as a file, so that a worker imports torch and triton, not kiln
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this package's modules are no top-level modules
    _main()
