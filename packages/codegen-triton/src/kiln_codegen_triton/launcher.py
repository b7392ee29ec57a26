"""Loading, autotuning and launching generated Triton kernels.

``load_kernels({name: KernelSpec})`` writes each source to the on-disk cache
(``$KILN_CACHE_DIR/triton_src/<hash>/kernel.py``: ``@triton.jit`` needs a real file), imports
them in parallel threads and returns ``{name: TritonLauncher}``.

A ``TritonLauncher`` is what the wrapper calls: ``kernel.run(stream, buf0, arg0, s0, xnumel)``
(the stream read once per wrapper call; ``kernel(*args)`` asks for it itself). It picks a
block-size config, computes the grid from the numel arguments and launches; on a GPU, after
the first launch, through a generated fast path and Triton's C launcher (``DirectLaunch``). The config is
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

import kiln_runtime

from . import compile_workers

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
    #: a split reduction: the dtype of each reduction's partial results (empty: not split)
    split_dtypes: tuple = ()
    #: cooperative rows (cooperative.py): float32 partials per (row, chunk); 0: not cooperative
    cooperative_parts: int = 0


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
    """Compile every kernel x config before the first call, on placeholder arguments with the
    example sizes: the real launch then finds the binary in Triton's cache. With compile
    workers running (``compile_workers``), each pair compiles in a worker process first and
    this process only loads it; threads overlap the rest. A split reduction compiles both its
    kernels, with the extra arguments the example sizes give it. Best effort: a failure here
    only means that kernel compiles at its first launch."""
    import torch

    jobs = []
    seen = set()
    for ln in launchers:
        if not ln.spec.arg_dtypes or ln.spec.cooperative_parts:
            continue  # cooperative kernels compile at their first launch (size-dependent args)
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
    if len(jobs) >= compile_workers.MIN_JOBS:
        compile_workers.start()

    def one(i: int) -> None:
        ln, c, args = jobs[i]
        types, full, config, kernels = list(ln.spec.arg_dtypes), list(args), c, ("kiln_kernel",)
        if ln.spec.split_dtypes:  # its extra arguments at the example sizes, and its final kernel
            extra, more, _, _ = ln._split_args(c, args)
            types += [*ln.spec.split_dtypes, "int", "int"]
            full, config, kernels = full + list(extra), {**c, **more}, ("kiln_kernel", "kiln_kernel_final")
        try:
            warmups = ln._warmups(c, args)
        except Exception:  # noqa: BLE001  (reported by the timed launch)
            return
        captured = None
        if compile_workers.ready():  # what the JIT would compile: the worker then needs no torch
            captured = tuple(compile_workers.captured_compile(fn, warmup) for fn, warmup in warmups)
            captured = captured if any(x is not None for x in captured) else None
        future = compile_workers.submit(compile_workers.job_for(
            ln.path, types, [a for a in full if isinstance(a, int)], config, kernels=kernels, captured=captured))
        if future is not None:
            kiln_runtime.counters["triton_worker_compiles"] += 1
            kiln_runtime.counters["triton_worker_compiles_without_torch"] += captured is not None
            compile_workers.wait(future)
        ln._warmup(c, args, warmups)

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        list(pool.map(one, range(len(jobs))))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class TritonLauncher:
    def __init__(self, name: str, fn, path: str, spec: KernelSpec):
        self.name, self.fn, self.path, self.spec = name, fn, path, spec
        self.chosen: dict[tuple, dict] = {}
        self._entries: dict[tuple, _LaunchEntry] = {}
        self._coop_ws: dict[tuple, tuple] = {}
        self._xnumel = self._numel_getter("xnumel")
        self._ynumel = self._numel_getter("ynumel")
        #: what the wrapper calls: ``run(stream, *args)``; replaced by a generated fast path
        #: (``DirectLaunch.fast``) once the kernel is compiled, where that path applies
        self.run = self._run_general
        #: constant numels: one config and one grid for every call
        self._static = all(not isinstance(spec.numels.get(k, 1), str) for k in ("xnumel", "ynumel"))
        self._fast_device = None  # the device the fast path's kernel is loaded on

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
        """A split reduction's extra arguments: the partial results buffers, the chunk of the
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
        partials = [torch.empty(nsplit * xnumel, dtype=dt, device=device) for dt in self.spec.split_dtypes]
        splitb = 1 << max(0, (nsplit - 1).bit_length())
        return [*partials, rchunk, nsplit], {"SPLITB": splitb}, (xtiles, nsplit), xtiles

    def _coop_args(self, config: dict, args) -> tuple[list, dict, tuple]:
        """Cooperative rows' extra arguments: the partials workspace and the per-row ticket
        counters (kept per (device, stream, rows, K, parts): never reset, see cooperative.py), the
        chunk length and K; the grid (rows x K programs, a row's K consecutive)."""
        import torch

        from .cooperative import lag_units, partials_block, split_row

        lagged = "LAG_BYTES" in config
        xnumel, rnumel = self._numel("xnumel", args), self._numel("rnumel", args)
        rchunk, k = split_row(rnumel, config["RBLOCK"], config.get("CHUNK_BYTES"), lagged=lagged)
        device = next(a.device for a in args if hasattr(a, "device"))
        # per stream too: two launches in flight at once must not share counters
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (str(device), stream, xnumel, k, self.spec.cooperative_parts, lagged)
        ws = self._coop_ws.get(key)
        if ws is None:  # (lagged: a second counter per row, the normalize units' tickets)
            ws = self._coop_ws[key] = (
                torch.empty(xnumel * k * self.spec.cooperative_parts, dtype=torch.float32, device=device),
                torch.zeros(xnumel * (2 if lagged else 1), dtype=torch.int64, device=device))
        more = {"SPLITB": partials_block(k, config.get("num_warps", 4))}
        if lagged:  # stats and normalize units: two programs per chunk
            units = xnumel * k
            return [*ws, rchunk, k, units, lag_units(config["LAG_BYTES"], rchunk, k, units)], more, (2 * units,)
        return [*ws, rchunk, k], more, (xnumel * k,)

    def _launch(self, config: dict, args) -> None:
        meta = {k: v for k, v in config.items()
                if k not in ("num_warps", "num_stages", "maxnreg", "CHUNK_BYTES", "LAG_BYTES")}
        opts = {} if _interpreting() else {k: config[k] for k in ("num_warps", "num_stages", "maxnreg") if k in config}
        try:
            if self.spec.cooperative_parts:
                extra, more, grid = self._coop_args(config, args)
                self.fn[grid](*args, *extra, **meta, **more, **opts)
                return
            if self.spec.split_dtypes:
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
        """``kernel(*args)`` outside a wrapper (output_code.py, tests): asks for the current
        stream itself, then ``run``."""
        if not _lean_launch_enabled():
            self.run(None, *args)
            return
        device = _DRIVER[0]()
        run = self.run if device == self._fast_device else self._run_general  # (fast: one device)
        run(_DRIVER[1](device), *args)

    def _run_general(self, stream, *args) -> None:
        """Every launch until a fast path is installed (and after, for what it does not
        cover): config per numel, then the compiled kernel per specialization."""
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
        if entry.splits is not None:
            self._run_split(entry, stream, args)
            return
        key = (_DRIVER[0](), _specialization_key(args))  # a compiled kernel is loaded on one device
        launch = entry.lean.get(key)
        if launch is not None:
            launch(*entry.grid, stream, args)
            return
        kernel = self._first_launch(self.fn, args, entry.grid, entry.meta, entry.opts)
        if not hasattr(kernel, "packed_metadata"):  # another Triton: its own launch path only
            entry.lean = None
            return
        direct = DirectLaunch.of(kernel, len(args) + len(entry.constexprs))
        entry.lean[key] = direct.general(entry.constexprs)
        kiln_runtime.counters["triton_lean_launch_kernels"] += 1
        if (self._static and self._fast_device is None
                and all(hasattr(a, "data_ptr") and k[0] for a, k in zip(args, key[1], strict=True))):
            # only tensors, every pointer 16-byte aligned: left to check per call is alignment
            # (a wrapper launches on its graph's device only)
            self.run = direct.fast(len(args), entry.grid, entry.constexprs, self._run_general)
            self._fast_device = key[0]

    def _first_launch(self, fn, args, grid, meta, opts):
        return _first_launch(fn, self.name, self.path, args, grid, meta, opts)

    def _run_split(self, entry: _LaunchEntry, stream, args) -> None:
        """A split reduction's two launches (partials, then the final kernel), each through
        its compiled kernel's direct launch once compiled. The extra arguments are made once
        per row length and kept: the partial buffers are scratch that the final kernel reads
        right after, in stream order."""
        rnumel = self._numel("rnumel", args)
        split = entry.splits.get(rnumel)
        if split is None:
            extra, more, grid, xtiles = self._split_args(entry.config, args)
            split = entry.splits[rnumel] = _SplitEntry(
                tuple(extra), {**entry.meta, **more}, (*grid, 1), (xtiles, 1, 1), {})
        full = (*args, *split.extra)
        key = (_DRIVER[0](), _specialization_key(full))
        launches = split.lean.get(key)
        if launches is not None:
            launches[0](*split.grid, stream, full)
            launches[1](*split.final_grid, stream, full)
            return
        kernels = [self._first_launch(fn, full, grid, split.meta, entry.opts)
                   for fn, grid in ((self.fn, split.grid), (self.fn.final, split.final_grid))]
        names = list(getattr(self.fn, "arg_names", []))[len(full):]
        if not all(hasattr(k, "packed_metadata") for k in kernels) or any(n not in split.meta for n in names):
            entry.lean = None  # another Triton: its own launch path only
            return
        constexprs = tuple(split.meta[n] for n in names)
        launches = split.lean[key] = tuple(
            DirectLaunch.of(k, len(full) + len(constexprs)).general(constexprs) for k in kernels)
        kiln_runtime.counters["triton_lean_launch_kernels"] += 2
        if (self._static and not isinstance(self.spec.numels.get("rnumel"), str) and self._fast_device is None
                and all(hasattr(a, "data_ptr") and k[0] for a, k in zip(args, key[1], strict=False))):
            self.run = self._split_fast_path(split, launches)
            self._fast_device = key[0]

    def _split_fast_path(self, split: _SplitEntry, launches: tuple):
        """``run(stream, *args)`` for a split reduction of constant sizes whose arguments are
        all tensors: what is left to check per call is each pointer's 16-byte alignment (the
        specialization both kernels were compiled for), else the general path."""
        main, final = launches
        extra, grid, final_grid, general = split.extra, split.grid, split.final_grid, self._run_general

        def run(stream, *args):
            for a in args:
                if a.data_ptr() & 15:
                    return general(stream, *args)
            full = args + extra
            main(*grid, stream, full)
            final(*final_grid, stream, full)

        return run

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

    def _warmups(self, config: dict, args) -> list[tuple]:
        """(jit function, its ``warmup`` call) for each kernel one config compiles: one, a
        split reduction's two (with the extra arguments these sizes get), none for a
        cooperative kernel (it compiles at its first launch: its extra arguments depend on
        sizes)."""
        meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
        opts = {k: config[k] for k in ("num_warps", "num_stages") if k in config}
        if self.spec.cooperative_parts:
            return []
        if self.spec.split_dtypes:
            extra, more, grid, xtiles = self._split_args(config, args)
            main, final = self.fn, self.fn.final
            return [(main, lambda: main.warmup(*args, *extra, grid=grid, **meta, **more, **opts)),
                    (final, lambda: final.warmup(*args, *extra, grid=(xtiles,), **meta, **more, **opts))]
        fn, grid = self.fn, self.grid(config, args)
        return [(fn, lambda: fn.warmup(*args, grid=grid, **meta, **opts))]

    def _warmup(self, config: dict, args, warmups: list | None = None) -> None:
        """Compile (or find in Triton's cache) and load each kernel of one config; ``warmups``:
        ``_warmups``' list when the caller has it already."""
        try:
            for _, warmup in self._warmups(config, args) if warmups is None else warmups:
                compile_workers.load_handles(warmup())
        except Exception:
            pass  # reported by the timed launch


def _first_launch(fn, name: str, path: str, args, grid, meta: dict, opts: dict):
    """Triton's own path: compiles (or finds) ``fn``'s specialization for ``args``, launches
    it once, and returns the compiled kernel with its handles loaded."""
    try:
        kernel = fn.run(*args, grid=grid, warmup=False, **meta, **opts)
    except Exception as e:
        if type(e).__name__ in ("CompilationError", "CompileTimeAssertionFailure"):
            raise TritonCompileError(name, path, f"{type(e).__name__}: {e}") from e
        raise
    kernel._init_handles()
    return kernel


#: Triton launch options among a launch's keyword arguments (the rest are constexprs)
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg")


class TemplateLauncher:
    """A hand-written template kernel (FlexAttention's forward, backward and decoding kernels)
    launched as the generated ones are: ``launcher[grid](*args, **constexprs, **options)``
    goes through Triton's ``JITFunction.run`` once per (device, constexprs, options,
    specialization), then through the compiled kernel's direct launch
    (``DirectLaunch.general``). Triton's binder, cache key and global checks cost tens of
    microseconds per launch over some fifty arguments; a FlexAttention training step makes
    three launches and its kernels run about 0.1 ms each at length 1024."""

    def __init__(self, fn, name: str, path: str):
        self.fn, self.name, self.path = fn, name, path
        self._launches: dict = {}

    def __repr__(self) -> str:
        return f"TemplateLauncher({self.name}, {len(self._launches)} compiled launches)"

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launch(grid, args, kw)

    def launch(self, grid, args: tuple, kw: dict) -> None:
        if not _lean_launch_enabled():
            self.fn[grid](*args, **kw)
            return
        names = list(getattr(self.fn, "arg_names", ()))[len(args):]
        opts = {k: kw[k] for k in _LAUNCH_OPTIONS if k in kw}
        if not names or len(kw) != len(names) + len(opts) or not all(n in kw for n in names):
            self.fn[grid](*args, **kw)  # defaults or unknown keywords: Triton's own binder
            return
        constexprs = tuple(kw[n] for n in names)
        device = _DRIVER[0]()
        key = (device, constexprs, tuple(opts.items()), _specialization_key(args))
        grid = (tuple(grid) + (1, 1))[:3]
        run = self._launches.get(key)
        if run is not None:
            run(*grid, _DRIVER[1](device), args)
            return
        kernel = self._first_launch(args, grid, {n: kw[n] for n in names}, opts)
        if hasattr(kernel, "packed_metadata"):  # (another Triton: its own launch path only)
            self._launches[key] = DirectLaunch.of(kernel, len(args) + len(names)).general(constexprs)
            kiln_runtime.counters["triton_template_lean_launches"] += 1

    def _first_launch(self, args, grid, meta: dict, opts: dict):
        """The first launch of a specialization; where its tiles need more shared memory than
        the GPU has (a mod that gathers from tables keeps more in flight), with fewer pipeline
        stages until it fits: a template's tiles are chosen before its mods are known."""
        while True:
            try:
                return _first_launch(self.fn, self.name, self.path, args, grid, meta, opts)
            except Exception as e:
                stages = opts.get("num_stages", 3)
                if type(e).__name__ != "OutOfResources" or stages <= 1:
                    raise
                log.debug("kiln: %s needs more shared memory than the GPU has at %d pipeline "
                          "stages (%s); trying %d", self.name, stages, e, stages - 1)
                opts = {**opts, "num_stages": stages - 1}


@dataclass
class _SplitEntry:
    """A split reduction's launch at one row length: its extra arguments (partial buffers, row
    chunk, chunk count), Triton keyword arguments, both grids, and by (device,
    specialization) the two direct launches."""

    extra: tuple
    meta: dict
    grid: tuple
    final_grid: tuple
    lean: dict


@dataclass
class _LaunchEntry:
    """One launcher's launch at one numel: its config, grid and Triton keyword arguments, and
    (on a GPU) by (device, specialization) the compiled kernel's launch function
    (``DirectLaunch.general``: what Triton's ``JITFunction.run`` does after its binder,
    cache-key and global checks, which cost tens of microseconds per launch, more than a small
    kernel runs). ``lean`` is None where the direct call is not used (interpreter, cooperative
    reductions, Triton launch hooks, ``KILN_TRITON_LEAN_LAUNCH=0``)."""

    config: dict
    grid: tuple
    meta: dict
    opts: dict
    constexprs: tuple
    lean: dict | None
    #: a split reduction's launches by row length (``TritonLauncher._run_split``)
    splits: dict[int, _SplitEntry] | None = None

    @staticmethod
    def build(launcher: TritonLauncher, config: dict, args) -> _LaunchEntry:
        meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
        opts = {k: config[k] for k in ("num_warps", "num_stages") if k in config}
        lean = None
        constexprs: tuple = ()
        grid = launcher.grid(config, args)
        grid = (grid + (1, 1))[:3]
        if _lean_launch_enabled() and launcher.spec.split_dtypes and not launcher.spec.cooperative_parts:
            return _LaunchEntry(config, grid, meta, opts, constexprs, {}, splits={})
        if _lean_launch_enabled() and not launcher.spec.split_dtypes and not launcher.spec.cooperative_parts:
            names = list(getattr(launcher.fn, "arg_names", []))
            rest = names[len(args):]
            if names and all(n in meta for n in rest) and len(meta) == len(rest):
                constexprs = tuple(meta[n] for n in rest)
                lean = {}
        return _LaunchEntry(config, grid, meta, opts, constexprs, lean)


class _Slot:
    """A stand-in argument: where the compiled kernel's launcher puts it is recorded."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<slot {self.name}>"


_LAUNCH_SLOTS = ("gx", "gy", "gz", "stream", "function", "metadata")


class DirectLaunch:
    """How to launch one compiled kernel with the least Python: a call expression (tokens)
    and the constants it names.

    Triton's compiled kernel ``run`` is a Python object (``CudaLauncher``) whose ``__call__``
    allocates scratch memory where the kernel needs some, then calls a C function ``launch``
    with the grid, stream, function, the kernel's constants and the arguments. Where the kernel
    needs no scratch memory, kiln calls that C function itself. Its argument layout differs
    between Triton versions, so it is not written down here: it is recorded once per kernel by
    calling ``run`` with stand-ins (``_Slot``) while ``launch`` is replaced by a recorder.
    Anything unexpected (scratch memory, a stand-in that ``run`` computes with, a layout that
    does not come out whole, ``KILN_TRITON_DIRECT_LAUNCH=0``) keeps the call through ``run``."""

    def __init__(self, tokens: list, names: dict):
        self.tokens = tokens  # slot names, "ARGS" (splat), "(ARGS,)" (one tuple), constants' names
        self.names = names

    def __repr__(self) -> str:
        return f"DirectLaunch({self.render({})})"

    @staticmethod
    def of(kernel, nargs: int) -> DirectLaunch:
        run = kernel.run
        names = {"_function": kernel.function, "_metadata": kernel.packed_metadata}
        recorded = _record_c_launch(run, nargs) if _direct_c_launch_enabled() else None
        if recorded is None:
            names["_run"] = run
            return DirectLaunch(["_run(", "gx", "gy", "gz", "stream", "function", "metadata",
                                 "None", "None", "None", "ARGS"], names)
        names["_launch"] = run.launch
        tokens = ["_launch("]
        for i, tok in enumerate(recorded):
            if isinstance(tok, tuple) and (tok[1] is None or type(tok[1]) in (bool, int)):
                tokens.append(repr(tok[1]))  # a literal: no name to look up per launch
            elif isinstance(tok, tuple):  # ("const", value)
                names[f"_k{i}"] = tok[1]
                tokens.append(f"_k{i}")
            else:
                tokens.append(tok)
        kiln_runtime.counters["triton_c_launch_kernels"] += 1
        return DirectLaunch(tokens, names)

    def render(self, values: dict) -> str:
        """The call's text, slots replaced by ``values`` (``ARGS``: the argument list text)."""
        fixed = {"function": "_function", "metadata": "_metadata"}
        parts = []
        for tok in self.tokens[1:]:
            if tok == "(ARGS,)":
                parts.append(f"({values.get('ARGS', 'ARGS')},)")
            else:
                parts.append(str(values.get(tok, fixed.get(tok, tok))))
        return f"{self.tokens[0]}{', '.join(parts)})"

    def general(self, constexprs: tuple):
        """``launch(gx, gy, gz, stream, args)`` for any call."""
        code = ("def launch(gx, gy, gz, stream, args):\n"
                "    args = args + _constexprs\n"
                f"    {self.render({'ARGS': '*args'})}\n")
        return _exec_function(code, "launch", {**self.names, "_constexprs": constexprs})

    def fast(self, nargs: int, grid: tuple, constexprs: tuple, slow):
        """``run(stream, a0, a1, ...)`` for a launcher whose numels are constants and whose
        arguments are all tensors: the grid and constexprs are literals, the one check left is
        that every pointer is 16-byte aligned (the specialization it was compiled for), else
        ``slow``."""
        params = ", ".join(f"a{i}" for i in range(nargs))
        consts = {f"_c{j}": c for j, c in enumerate(constexprs)}
        texts = [repr(c) if c is None or type(c) in (bool, int) else n for n, c in consts.items()]
        values = {"gx": grid[0], "gy": grid[1], "gz": grid[2], "ARGS": ", ".join([params, *texts])}
        ptrs = " | ".join(f"a{i}.data_ptr()" for i in range(nargs))
        code = (f"def run(stream, {params}):\n"
                f"    if ({ptrs}) & 15:\n"
                f"        return _slow(stream, {params})\n"
                f"    {self.render(values)}\n")
        return _exec_function(code, "run", {**self.names, **consts, "_slow": slow})


def _exec_function(code: str, name: str, namespace: dict):
    namespace = dict(namespace)
    exec(compile(code, f"<kiln-triton-{name}>", "exec"), namespace)
    fn = namespace[name]
    fn.source = code  # for people debugging a launch
    return fn


def _record_c_launch(run, nargs: int) -> list | None:
    """The argument layout ``run`` gives Triton's C ``launch``: one token per argument (a slot
    name, ``"ARGS"``/``"(ARGS,)"`` for the kernel arguments, or ``("const", value)``), or None
    where it cannot be recorded whole (see ``DirectLaunch``)."""
    c_launch = getattr(run, "launch", None)
    if (nargs == 0 or not callable(c_launch) or getattr(run, "global_scratch_size", 0)
            or getattr(run, "profile_scratch_size", 0) or getattr(run, "gsan_enabled", False)):
        return None
    slots = {n: _Slot(n) for n in _LAUNCH_SLOTS}
    argslots = tuple(_Slot(f"a{i}") for i in range(nargs))
    own = "launch" in getattr(run, "__dict__", {})
    calls: list = []
    try:
        run.launch = lambda *a: calls.append(a)
    except Exception:  # noqa: BLE001  (a launcher whose attributes are fixed)
        return None
    try:
        run(*(slots[n] for n in _LAUNCH_SLOTS), None, None, None, *argslots)
    except Exception:  # noqa: BLE001  (this Triton's launcher computes with its arguments)
        return None
    finally:
        if own:
            run.launch = c_launch
        else:
            del run.launch
    if len(calls) != 1:
        return None
    rec, tokens, found, i = calls[0], [], set(), 0
    while i < len(rec):
        v = rec[i]
        if isinstance(v, _Slot) and v.name in slots:
            tokens.append(v.name)
            found.add(v.name)
        elif isinstance(v, tuple) and len(v) == nargs and all(a is b for a, b in zip(v, argslots, strict=True)):
            tokens.append("(ARGS,)")
            found.add("args")
        elif v is argslots[0] and all(a is b for a, b in zip(rec[i:i + nargs], argslots, strict=False)):
            tokens.append("ARGS")
            found.add("args")
            i += nargs
            continue
        elif _holds_slot(v):
            return None
        else:
            tokens.append(("const", v))
        i += 1
    return tokens if found == set(_LAUNCH_SLOTS) | {"args"} else None


def _holds_slot(v) -> bool:
    if isinstance(v, _Slot):
        return True
    if isinstance(v, (tuple, list)):
        return any(_holds_slot(x) for x in v)
    if isinstance(v, dict):
        return any(_holds_slot(x) for x in v.values())
    return False


def _direct_c_launch_enabled() -> bool:
    return os.environ.get("KILN_TRITON_DIRECT_LAUNCH", "1") != "0"


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


def raw_stream_function():
    """``get_raw_stream(index) -> int``: the current CUDA stream of a device as the integer
    handle Triton's launcher takes (torch's C function where there is one); the wrapper
    prelude calls it once per graph call."""
    import torch

    fn = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return fn if fn is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


def _sm_count() -> int:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
