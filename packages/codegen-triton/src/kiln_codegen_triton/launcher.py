"""Loading, autotuning and launching generated Triton kernels.

``load_kernels({name: KernelSpec})`` writes each source to the on-disk cache
(``$KILN_CACHE_DIR/triton_src/<hash>/kernel.py``: ``@triton.jit`` needs a real file), imports
them in parallel threads and returns ``{name: TritonLauncher}``.

A ``TritonLauncher`` is what the wrapper calls: ``kernel(buf0, arg0, s0, xnumel)``. It picks a
block-size config, computes the grid from the numel arguments and launches. The config is
chosen on the first call: under ``TRITON_INTERPRET=1`` the first candidate (no benchmarking);
on a GPU each candidate is compiled (in parallel threads) and timed on the real arguments
(buffers the kernel writes are restored after timing), and the winner is stored on disk under
a key of source + numels, so a second process does not benchmark again.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kiln_runtime

log = logging.getLogger("kiln")


class TritonCompileError(RuntimeError):
    """A generated Triton kernel failed to load or compile. ``kernel_name``/``source_path``
    name it (the backend then runs the graph on loopir's interpreter)."""

    def __init__(self, kernel_name: str, source_path: str, message: str):
        self.kernel_name = kernel_name
        self.source_path = source_path
        super().__init__(f"Triton kernel {kernel_name} ({source_path}): {message}")


@dataclass
class KernelSpec:
    """What a launcher needs: source, tiling kind, candidate configs, where the numels are
    (argument position or a constant), which argument positions the kernel writes."""

    source: str
    tiling: str  # "pointwise1d" | "pointwise2d" | "reduction"
    configs: list[dict]
    numels: dict[str, int | str]  # "xnumel"/"ynumel" -> constant or argument name
    arg_names: list[str]
    written: list[int] = field(default_factory=list)
    #: for compiling before the first call (GPU): argument dtypes ("int" for sizes) and the
    #: size arguments' example values
    arg_dtypes: list = field(default_factory=list)
    arg_hints: dict[str, int] = field(default_factory=dict)
    #: a split reduction: the dtype of its partial results (None: not split)
    split_dtype: Any = None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def _source_path(name: str, source: str) -> str:
    key = kiln_runtime.hash_key("triton-src", source)
    path = kiln_runtime.disk_cache.get_or_build(
        "triton_src", key, lambda tmp: (tmp / "kernel.py").write_text(source))
    return str(path / "kernel.py")


#: source -> (jit function, path): identical kernels (a model's repeated layers) share one
#: JITFunction, so one compile; config choices are shared the same way
_LOADED: dict[str, tuple] = {}
_CHOSEN: dict[tuple, dict] = {}


def _import(name: str, source: str):
    if source in _LOADED:
        return _LOADED[source]
    path = _source_path(name, source)
    try:
        spec = importlib.util.spec_from_file_location(f"kiln_triton_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.kiln_kernel.final = getattr(module, "kiln_kernel_final", None)
        _LOADED[source] = (module.kiln_kernel, path)
        return _LOADED[source]
    except Exception as e:
        raise TritonCompileError(name, path, f"{type(e).__name__}: {e}") from e


def load_kernels(specs: dict[str, KernelSpec]) -> dict[str, TritonLauncher]:
    """Import every kernel (in parallel threads) and wrap each in a launcher."""
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(specs)))) as pool:
        loaded = dict(zip(specs, pool.map(lambda kv: _import(*kv), [(n, s.source) for n, s in specs.items()]),
                          strict=True))
    launchers = {name: TritonLauncher(name, loaded[name][0], loaded[name][1], spec)
                 for name, spec in specs.items()}
    if not _interpreting() and os.environ.get("KILN_TRITON_PRECOMPILE", "1") != "0":
        try:
            precompile(list(launchers.values()))
        except Exception as e:  # best effort: kernels then compile at their first launch
            log.info("kiln: Triton precompile skipped: %s: %s", type(e).__name__, e)
    return launchers


def precompile(launchers: list[TritonLauncher]) -> None:
    """Compile every kernel x config before the first call, in parallel threads (Triton's
    compile runs LLVM and ptxas outside the GIL), on placeholder arguments with the example
    sizes: the real launch then finds the binary in Triton's cache. Best effort: a failure
    here only means that kernel compiles at its first launch."""
    import torch

    jobs = []
    seen = set()
    for ln in launchers:
        if not ln.spec.arg_dtypes:
            continue
        args = []
        for name, dt in zip(ln.spec.arg_names, ln.spec.arg_dtypes, strict=True):
            if dt == "int":
                args.append(int(ln.spec.arg_hints.get(name, 8)))
            else:
                args.append(torch.empty(16, dtype=dt, device="cuda"))
        for c in ln.spec.configs:
            key = (ln.spec.source, repr(c), tuple(a if isinstance(a, int) else str(a.dtype) for a in args))
            if key not in seen:
                seen.add(key)
                jobs.append((ln, c, args))
    if not jobs:
        return
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        list(pool.map(lambda j: j[0]._warmup(j[1], j[2]), jobs))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class TritonLauncher:
    def __init__(self, name: str, fn, path: str, spec: KernelSpec):
        self.name, self.fn, self.path, self.spec = name, fn, path, spec
        self.chosen: dict[tuple, dict] = {}
        self._entries: dict[tuple, _LaunchEntry] = {}
        self._xnumel = self._numel_getter("xnumel")
        self._ynumel = self._numel_getter("ynumel")

    def _numel_getter(self, key: str):
        """``args -> numel`` for one grid axis: a constant, or an argument position."""
        v = self.spec.numels.get(key, 1)
        if isinstance(v, str):
            pos = self.spec.arg_names.index(v)
            return lambda args: int(args[pos])
        v = int(v)
        return lambda args: v

    def __repr__(self) -> str:
        return f"<TritonLauncher {self.name} {self.spec.tiling} ({self.path})>"

    def _numel(self, key: str, args) -> int:
        v = self.spec.numels.get(key, 1)
        if isinstance(v, str):
            return int(args[self.spec.arg_names.index(v)])
        return int(v)

    def grid(self, config: dict, args) -> tuple[int, ...]:
        x = _cdiv(self._numel("xnumel", args), config["XBLOCK"])
        if self.spec.tiling == "pointwise2d":
            x *= _cdiv(self._numel("ynumel", args), config["YBLOCK"])
        return (x,)

    def _split_args(self, config: dict, args) -> tuple[list, dict, tuple, int]:
        """A split reduction's extra arguments: the partial results buffer, the chunk of the
        row each program reduces, the number of chunks; its grid (rows, chunks)."""
        import torch

        xnumel, rnumel = self._numel("xnumel", args), self._numel("rnumel", args)
        rblock = config["RBLOCK"]
        xtiles = _cdiv(xnumel, config["XBLOCK"])
        target = 8 if _interpreting() else 2 * _sm_count()
        nsplit = max(1, min(_cdiv(target, xtiles), _cdiv(rnumel, rblock), 1024))
        rchunk = _cdiv(_cdiv(rnumel, nsplit), rblock) * rblock
        nsplit = _cdiv(rnumel, rchunk)
        device = next(a.device for a in args if hasattr(a, "device"))
        partial = torch.empty(nsplit * xnumel, dtype=self.spec.split_dtype, device=device)
        splitb = 1 << max(0, (nsplit - 1).bit_length())
        return [partial, rchunk, nsplit], {"SPLITB": splitb}, (xtiles, nsplit), xtiles

    def _launch(self, config: dict, args) -> None:
        meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
        opts = {} if _interpreting() else {k: config[k] for k in ("num_warps", "num_stages") if k in config}
        try:
            if self.spec.split_dtype is not None:
                extra, more, grid, xtiles = self._split_args(config, args)
                self.fn[grid](*args, *extra, **meta, **more, **opts)
                self.fn.final[(xtiles,)](*args, *extra, **meta, **more, **opts)
                return
            self.fn[self.grid(config, args)](*args, **meta, **opts)
        except Exception as e:
            if type(e).__name__ in ("CompilationError", "CompileTimeAssertionFailure", "InterpreterError"):
                raise TritonCompileError(self.name, self.path, f"{type(e).__name__}: {e}") from e
            raise

    def __call__(self, *args) -> None:
        numels = (self._xnumel(args), self._ynumel(args))
        if numels[0] == 0 or numels[1] == 0:
            return
        entry = self._entries.get(numels)
        if entry is None:
            config = self.chosen.get(numels)
            if config is None:
                config = self.chosen[numels] = self._choose(args, numels)
            entry = self._entries[numels] = _LaunchEntry.build(self, config, args)
        if entry.lean is None:
            self._launch(entry.config, args)
            return
        device = _DRIVER[0]()
        key = (device, _specialization_key(args))  # a compiled kernel is loaded on one device
        kernel = entry.lean.get(key)
        if kernel is None:  # Triton's own path compiles (or finds) this specialization
            try:
                kernel = self.fn.run(*args, grid=entry.grid, warmup=False, **entry.meta, **entry.opts)
            except Exception as e:
                if type(e).__name__ in ("CompilationError", "CompileTimeAssertionFailure"):
                    raise TritonCompileError(self.name, self.path, f"{type(e).__name__}: {e}") from e
                raise
            kernel._init_handles()
            if not hasattr(kernel, "packed_metadata"):  # another Triton: its own launch path only
                entry.lean = None
                return
            entry.lean[key] = kernel
            kiln_runtime.counters["triton_lean_launch_kernels"] += 1
            return
        kernel.run(*entry.grid, _DRIVER[1](device), kernel.function, kernel.packed_metadata,
                   None, None, None, *args, *entry.constexprs)

    # ---------------------------------------------------------------------------- autotuning
    def _choose(self, args, numels) -> dict:
        configs = self.spec.configs
        if _interpreting() or len(configs) == 1 or os.environ.get("KILN_TRITON_AUTOTUNE", "1") == "0":
            return configs[0]
        shared = (self.spec.source, numels)
        if shared in _CHOSEN:
            return _CHOSEN[shared]
        key = kiln_runtime.hash_key("triton-tune", self.spec.source, json.dumps(configs),
                                    json.dumps(numels), _device_name())
        hit = kiln_runtime.disk_cache.get("triton_tune", key)
        if hit is not None:
            kiln_runtime.counters["triton_autotune_cache_hits"] += 1
            _CHOSEN[shared] = json.loads((hit / "choice.json").read_text())
            return _CHOSEN[shared]
        best = self._benchmark(args, configs)
        kiln_runtime.disk_cache.put("triton_tune", key, {"choice.json": json.dumps(best)})
        _CHOSEN[shared] = best
        return best

    def _benchmark(self, args, configs) -> dict:
        import torch
        from triton.testing import do_bench

        saved = {i: args[i].clone() for i in self.spec.written}
        with ThreadPoolExecutor(max_workers=min(8, len(configs))) as pool:  # compile in parallel
            list(pool.map(lambda c: self._warmup(c, args), configs))
        times = []
        for c in configs:
            try:
                times.append((do_bench(lambda c=c: self._launch(c, args), warmup=1, rep=3), c))
            except Exception as e:  # a config that does not fit (registers, shared memory)
                log.info("kiln: triton config %s of %s failed: %s", c, self.name, e)
        for i, t in saved.items():
            args[i].copy_(t)
        torch.cuda.synchronize()
        if not times:
            raise TritonCompileError(self.name, self.path, "no config compiled")
        kiln_runtime.counters["triton_autotune_runs"] += 1
        return min(times, key=lambda tc: tc[0])[1]

    def _warmup(self, config: dict, args) -> None:
        meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
        opts = {k: config[k] for k in ("num_warps", "num_stages") if k in config}
        try:
            if self.spec.split_dtype is not None:
                return  # compiles at its first launch (its extra arguments depend on sizes)
            self.fn.warmup(*args, grid=self.grid(config, args), **meta, **opts)
        except Exception:
            pass  # reported by the timed launch


@dataclass
class _LaunchEntry:
    """One launcher's launch at one numel: its config, grid and Triton keyword arguments, and
    (on a GPU) the compiled kernels by specialization, launched directly through the compiled
    kernel's ``run`` (what Triton's ``JITFunction.run`` does after its binder, cache-key and
    global checks: those cost tens of microseconds per launch, more than a small kernel runs).
    ``lean`` is None where the direct call is not used (interpreter, split reductions, Triton
    launch hooks, ``KILN_TRITON_LEAN_LAUNCH=0``)."""

    config: dict
    grid: tuple
    meta: dict
    opts: dict
    constexprs: tuple
    lean: dict | None

    @staticmethod
    def build(launcher: TritonLauncher, config: dict, args) -> _LaunchEntry:
        meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
        opts = {k: config[k] for k in ("num_warps", "num_stages") if k in config}
        lean = None
        constexprs: tuple = ()
        grid = launcher.grid(config, args)
        grid = (grid + (1, 1))[:3]
        if _lean_launch_enabled() and launcher.spec.split_dtype is None:
            names = list(getattr(launcher.fn, "arg_names", []))
            rest = names[len(args):]
            if names and all(n in meta for n in rest) and len(meta) == len(rest):
                constexprs = tuple(meta[n] for n in rest)
                lean = {}
        return _LaunchEntry(config, grid, meta, opts, constexprs, lean)


def _specialization_key(args) -> tuple:
    """What Triton specializes a compiled kernel on, per argument: a pointer's 16-byte
    alignment, an integer's being 1, its divisibility by 16 and its width."""
    key = []
    for a in args:
        if isinstance(a, int):
            key.append((a == 1, a % 16 == 0, -2**31 <= a < 2**31))
        elif isinstance(a, float):
            key.append(float)  # floats are not specialized on
        elif hasattr(a, "data_ptr"):
            key.append((a.data_ptr() % 16 == 0, a.dtype))
        else:
            key.append((type(a), a))
    return tuple(key)


def _lean_launch_enabled() -> bool:
    if _interpreting() or os.environ.get("KILN_TRITON_LEAN_LAUNCH", "1") == "0":
        return False
    try:
        from triton import knobs
    except ImportError:
        return False
    if _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook):
        return False
    if not _DRIVER:
        try:
            from triton.runtime import driver

            _DRIVER[:] = [driver.active.get_current_device, driver.active.get_current_stream]
        except Exception:  # no active GPU driver: Triton's own launch path
            return False
    return True


def _hook_set(hook) -> bool:
    """A Triton launch hook in use: a callable (older Triton) or a non-empty ``HookChain``."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


#: (current device, current raw stream) of Triton's active driver, resolved once
_DRIVER: list = []


def _sm_count() -> int:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
