"""The graph-level compiled-artifact cache of the ``kiln`` backend.

A second process (or a deployed copy) that compiles the same torch-level graph with the
same inputs, options and tool versions skips tracing, lowering, scheduling, codegen, kernel
compiles and autotuning: it loads the stored wrapper source and kernels (kernel binaries come
from the kernel-level entries of ``kiln_runtime.disk_cache``) and binds the live module's
parameters.

**Key** (``graph_key``): the normalized FX graph (placeholders, modules and attributes renamed
by order of appearance; each called module described by its type, plain attributes and the
metadata of its tensors), the inputs' metadata (dtype, shape with symbols, stride, storage
offset, device, requires_grad, which inputs share memory), the global state the trace bakes in
(grad mode, default dtype, autocast, determinism, matmul precision: ``_tracing_state_text``), the
backend's ``Options``, and the versions of kiln (a hash of its packages' sources: an edited
checkout never hits an old entry), Python, torch, triton (when installed), the C++ compiler
(with the CPU's ISA flags) and the CUDA devices.

**Entry** (kind ``graph``): ``artifact.pt`` with either the decision to run the graph eagerly
(and why) or the wrapper source, the kernels (name, source, arguments, codegen meta), where
each graph constant comes from (a parameter/buffer of the live module by normalized name, a
copy of one in another layout, a conv weight or bias with a BatchNorm folded in, kept as
the recipe to fold it again from the live tensors, or a tensor stored in the entry), the
output structure and the facts the CUDA-graph wrapper needs. So an entry holds no weight
values and its key needs no hash of them: a hit remakes layout copies and folded constants
from the live module and re-checks the sources' version counters at each call. A stored
tensor we cannot tie to the module goes under a key that adds a hash of the weights' values
(kind ``by_weights``). Entries are pickled and written by a background thread (``flush()``
waits for it).

Not cached (compiled every time, logged on logger ``kiln.cache`` at DEBUG): graphs whose
description holds an object without a stable text (a lambda's address, a module hook),
training graphs (forward + backward), graphs whose compile added shape guards, and graphs
whose kernels fell back to the interpreter. ``KILN_COMPILE_DEBUG`` bypasses the cache (every
debug file is written); ``KILN_GRAPH_CACHE=0`` turns it off.

A corrupt entry (a file that fails its manifest) or a stale one (it unpickles to something
else, or a constant it names is missing) is logged, removed and rebuilt.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import itertools
import logging
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import kiln_runtime
import torch
from kiln_loopir.derived_constants import THREAD_TUNED, derive
from kiln_runtime import compile_timer, disk_cache
from kiln_runtime.cudagraphs import run_before_capture
from kiln_runtime.guards import WeightsGuard

from .codegens import codegen_by_name
from .options import Options
from .passes.fold_batchnorm import batch_counters, folded_value
from .recording import Recording, recording_scope
from .reduce_overhead import for_mode
from .stats import counters
from .wrappers import graph_facts, inference_only, out_structure, run_eagerly, structure_restorer

log = logging.getLogger("kiln.cache")

__all__ = [
    "KIND",
    "NotCacheable",
    "WeightsGuard",
    "compile_cached",
    "enabled",
    "flush",
    "graph_key",
]

#: the disk-cache kind of graph-level artifacts
KIND = "graph"
ARTIFACT = "artifact.pt"
_FORMAT = 2
#: packages whose code decides what a graph compiles to (their sources are in the key)
_KEYED_PACKAGES = (
    "kiln",
    "kiln_aotgrad",
    "kiln_loopir",
    "kiln_runtime",
    "kiln_codegen_cpp",
    "kiln_codegen_triton",
)


class NotCacheable(Exception):
    """This graph cannot be keyed or stored; the message says why."""


def enabled(config: Options) -> bool:
    """On unless ``KILN_GRAPH_CACHE=0`` or the compile writes a debug folder."""
    flag = os.environ.get("KILN_GRAPH_CACHE", "1").strip().lower()
    return flag not in ("0", "false", "no", "off") and not config.debug_enabled


# ============================================================================ the key


@functools.lru_cache(None)
def _sources_hash() -> str:
    """SHA-256 over the source files of kiln's compiler packages (not imported to find them)."""
    h = hashlib.sha256()
    for name in _KEYED_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            h.update(f"{name}:absent".encode())
            continue
        for root in spec.submodule_search_locations:
            for path in sorted(Path(root).rglob("*")):
                if path.suffix in (".py", ".c", ".cpp", ".h") and path.is_file():
                    h.update(str(path.relative_to(root)).encode())
                    h.update(path.read_bytes())
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(None)
def _cxx_version() -> str:
    try:
        from kiln_codegen_cpp.compiler import compiler_version

        return compiler_version()
    except Exception as e:  # no compiler: the C++ codegen fails anyway; keep keys stable
        return f"unavailable ({type(e).__name__})"


def _device_text(devices: set[str]) -> str:
    parts = []
    for dev in sorted(devices):
        d = torch.device(dev)
        if d.type == "cuda" and torch.cuda.is_available():
            index = d.index if d.index is not None else torch.cuda.current_device()
            cap = torch.cuda.get_device_capability(index)
            parts.append(f"{dev}:{torch.cuda.get_device_name(index)}:sm{cap[0]}{cap[1]}")
        else:
            parts.append(dev)
    return ",".join(parts)


def _versions(devices: set[str]) -> str:
    parts = [
        f"python={sys.version_info[0]}.{sys.version_info[1]}",
        f"torch={torch.__version__}",
        f"cuda={torch.version.cuda}",
        f"triton={_version('triton')}",
        f"kiln={_sources_hash()}",
        f"device={_device_text(devices)}",
    ]
    if any(torch.device(d).type == "cpu" for d in devices) or not devices:
        parts.append(f"cxx={_cxx_version()}")
    return "\n".join(parts)


def _callable_name(fn: Any) -> str:
    """Stable text of a call target: ``module.qualname`` (OpOverloads by their name); a
    function defined in a local scope adds a hash of its code."""
    if isinstance(fn, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return str(fn)
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "?")
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if qualname is None:
        raise NotCacheable(f"call target {fn!r} has no name")
    text = f"{module}.{qualname}"
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType) and ("<" in qualname or module == "__main__"):
        text += f"#{_code_hash(code)}"
    return text


def _code_hash(code: types.CodeType) -> str:
    h = hashlib.sha256(code.co_code)
    for const in code.co_consts:
        h.update((_code_hash(const) if isinstance(const, types.CodeType) else repr(const)).encode())
    h.update(repr(code.co_names).encode())
    return h.hexdigest()[:16]


def _tensor_meta(t: torch.Tensor) -> str:
    return (
        f"{type(t).__name__}({t.dtype}, {tuple(t.shape)}, {tuple(t.stride())}, "
        f"off={t.storage_offset()}, {t.device}, rg={t.requires_grad})"
    )


def _value_meta(v: Any) -> str:
    """Metadata of an example value: tensors (fake or real, sizes may be symbols), SymInts,
    plain constants."""
    if isinstance(v, torch.Tensor):
        return (
            f"T({v.dtype}, {list(map(str, v.shape))}, {list(map(str, v.stride()))}, "
            f"{v.device}, rg={v.requires_grad})"
        )
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        return f"Sym({v})"
    return _const_text(v)


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format)


def _const_text(v: Any) -> str:
    """Stable text of a constant argument or module attribute (raises NotCacheable)."""
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, _PLAIN):
        return f"{type(v).__name__}:{v!r}"
    if v is Ellipsis:
        return "..."
    if isinstance(v, slice):
        return f"slice({_const_text(v.start)}, {_const_text(v.stop)}, {_const_text(v.step)})"
    if isinstance(v, torch.Size | tuple | list):
        return f"{type(v).__name__}[{', '.join(_const_text(x) for x in v)}]"
    if isinstance(v, set | frozenset):
        return f"{type(v).__name__}{{{', '.join(sorted(_const_text(x) for x in v))}}}"
    if isinstance(v, dict):
        items = sorted((_const_text(k), _const_text(x)) for k, x in v.items())
        return "{" + ", ".join(f"{k}: {x}" for k, x in items) + "}"
    if isinstance(v, torch.Tensor):
        raise NotCacheable("a tensor is a constant argument of the graph")
    if isinstance(v, type) or callable(v):
        return _callable_name(v)
    text = repr(v)
    if " at 0x" in text or "object at" in text:
        raise NotCacheable(f"no stable text for {type(v).__name__} {text[:60]}")
    return f"{type(v).__module__}.{type(v).__qualname__}:{text}"


_SKIPPED_MODULE_KEYS = {"_parameters", "_buffers", "_modules", "training"}


def _module_text(mod: torch.nn.Module) -> str:
    """A module's type, plain attributes, tensors' metadata and children (recursively).
    Modules with hooks are not cacheable (a hook's effect has no stable text)."""
    lines = [f"{_callable_name(type(mod))} training={mod.training}"]
    for key, value in sorted(vars(mod).items()):
        if key in _SKIPPED_MODULE_KEYS:
            continue
        if "hook" in key:
            if value:
                raise NotCacheable(f"module {type(mod).__name__} has hooks ({key})")
            continue
        lines.append(f"  .{key} = {_const_text(value)}")
    for name, p in mod._parameters.items():
        lines.append(f"  param {name}: {_tensor_meta(p) if p is not None else 'None'}")
    for name, b in mod._buffers.items():
        lines.append(f"  buffer {name}: {_tensor_meta(b) if b is not None else 'None'}")
    for name, child in mod._modules.items():
        child_text = _module_text(child) if child is not None else "None"
        lines.append(f"  child {name}: " + child_text.replace("\n", "\n  "))
    return "\n".join(lines)


class GraphNames:
    """The renaming of a graph's modules (``m0, m1, ...``) and attributes (``a0, ...``),
    both ways: ``normalize("layer1.0.conv1.weight") == "m3.weight"`` and ``resolve`` gives
    the live tensor for a normalized name."""

    def __init__(self) -> None:
        self.to_norm: dict[str, str] = {}
        self.from_norm: dict[str, str] = {}

    def add(self, original: str, prefix: str) -> str:
        if original not in self.to_norm:
            norm = f"{prefix}{len(self.to_norm)}"
            self.to_norm[original] = norm
            self.from_norm[norm] = original
        return self.to_norm[original]

    def normalize(self, qualname: str) -> str | None:
        """The normalized name of a module tensor's qualified name (longest known prefix)."""
        atoms = qualname.split(".")
        for cut in range(len(atoms), 0, -1):
            head = ".".join(atoms[:cut])
            if head in self.to_norm:
                return ".".join([self.to_norm[head], *atoms[cut:]])
        return None

    def resolve(self, gm: torch.nn.Module, norm: str) -> Any:
        head, *rest = norm.split(".")
        obj: Any = gm
        for atom in [*self.from_norm[head].split("."), *rest]:
            obj = getattr(obj, atom)
        return obj


def normalized_graph(gm: torch.fx.GraphModule) -> tuple[str, GraphNames]:
    """The stable text of a torch-level graph and its renaming (see ``GraphNames``)."""
    names = GraphNames()
    node_names: dict[torch.fx.Node, str] = {}
    counter = itertools.count()
    lines: list[str] = []
    modules: dict[str, str] = {}

    def arg(a: Any) -> str:
        if isinstance(a, torch.fx.Node):
            return node_names[a]
        if isinstance(a, tuple | list):
            inner = ", ".join(arg(x) for x in a)
            return f"({inner},)" if isinstance(a, tuple) else f"[{inner}]"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {arg(v)}" for k, v in sorted(a.items())) + "}"
        if isinstance(a, slice):
            return f"slice({arg(a.start)}, {arg(a.stop)}, {arg(a.step)})"
        return _const_text(a)

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            name = f"in{next(counter)}"
            node_names[n] = name
            lines.append(f"{name} = input {_value_meta(n.meta.get('example_value', n.meta.get('val')))}")
            continue
        name = f"v{next(counter)}"
        node_names[n] = name
        call = f"({arg(n.args)[1:-1].rstrip(',')}; {arg(n.kwargs)})"
        if n.op == "call_function":
            lines.append(f"{name} = {_callable_name(n.target)}{call}")
        elif n.op == "call_method":
            lines.append(f"{name} = .{n.target}{call}")
        elif n.op == "call_module":
            norm = names.add(n.target, "m")
            if norm not in modules:
                modules[norm] = _module_text(gm.get_submodule(n.target))
            lines.append(f"{name} = {norm}{call}")
        elif n.op == "get_attr":
            norm = names.add(n.target, "a")
            value = names.resolve(gm, norm)
            meta = _tensor_meta(value) if isinstance(value, torch.Tensor) else _const_text(value)
            lines.append(f"{name} = attr {norm}: {meta}")
        elif n.op == "output":
            lines.append(f"return {arg(n.args)}")
        else:
            raise NotCacheable(f"unknown node kind {n.op}")
    lines += [f"{m}: {text}" for m, text in modules.items()]
    return "\n".join(lines), names


def _inputs_text(example_inputs: Sequence) -> str:
    """Inputs' metadata plus which inputs share memory (mutation handling depends on it)."""
    lines, storages = [], {}
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            try:
                ptr = (x.device, x.untyped_storage().data_ptr())
            except Exception:  # fake tensors have no real storage
                ptr = None
            alias = storages.setdefault(ptr, i) if ptr is not None else i
            lines.append(f"{i}: {_tensor_meta(x)} alias_of={alias}")
        else:
            lines.append(f"{i}: {_value_meta(x)}")
    return "\n".join(lines)


def _shape_env(gm: torch.fx.GraphModule):
    for n in gm.graph.nodes:
        v = n.meta.get("example_value", n.meta.get("val"))
        env = getattr(getattr(v, "fake_mode", None), "shape_env", None)
        if env is not None:
            return env
    return None


def _shape_env_state(env) -> str:
    """What the frontend turns into shape guards after the backend returns."""
    if env is None:
        return ""
    guards = [str(g.expr) for g in getattr(env, "guards", ())]
    ranges = sorted(f"{k}:{v}" for k, v in getattr(env, "var_to_range", {}).items())
    repl = sorted(f"{k}={v}" for k, v in getattr(env, "replacements", {}).items())
    return f"guards={guards}\nranges={ranges}\nreplacements={repl}"


def _config_text(config: Options) -> str:
    fields = dataclasses.asdict(config)
    fields.pop("debug", None)
    fields.pop("debug_dir", None)
    return repr(sorted(fields.items()))


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence, config: Options) -> tuple[str, GraphNames]:
    """The cache key of compiling ``gm`` on ``example_inputs`` with ``config`` (see the module
    docstring) and the graph's renaming. Raises ``NotCacheable``."""
    if not isinstance(gm, torch.fx.GraphModule):
        raise NotCacheable(f"the backend got a {type(gm).__name__}, not a GraphModule")
    text, names = normalized_graph(gm)
    devices = {str(x.device) for x in example_inputs if isinstance(x, torch.Tensor)}
    devices |= {str(t.device) for t in itertools.chain(gm.parameters(), gm.buffers())}
    key = disk_cache.hash_key(
        f"kiln-graph-artifact-{_FORMAT}",
        text,
        _inputs_text(example_inputs),
        _shape_env_state(_shape_env(gm)),
        _tracing_state_text(),
        _config_text(config),
        _versions(devices),
    )
    return key, names


def _tracing_state_text() -> str:
    """torch's global state that the ATen trace bakes in: grad mode (a training graph or
    not), the default dtype, autocast (it inserts casts: a graph compiled outside
    ``torch.autocast`` must not be reused inside one), and the determinism and float32
    matmul-precision flags (kernels and decompositions chosen by them)."""
    autocast = [(device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                for device in ("cpu", "cuda")]
    return (f"grad={torch.is_grad_enabled()} default_dtype={torch.get_default_dtype()} "
            f"autocast={autocast} deterministic={torch.are_deterministic_algorithms_enabled()} "
            f"matmul_precision={torch.get_float32_matmul_precision()}")


# ============================================================================ recording


# ============================================================================ the backend hook

_graph_ids = itertools.count()


def compile_cached(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence,
    config: Options,
    compile_fn: Callable[[], Callable],
) -> Callable:
    """``compile_fn()`` (the backend's pipeline) through the graph-level cache, with its
    phases timed (``KILN_LOGS=perf``). A hit returns what the pipeline would: the loaded
    graph with CUDA graphs per ``config.mode``, the torch-level output structure and the
    grad-mode guard, or the graph's own forward when the pipeline had decided to run it
    eagerly."""
    is_gm = isinstance(gm, torch.fx.GraphModule)
    label = f"graph {next(_graph_ids)} ({gm.meta.get('kiln_code_name', 'fx graph')})" if is_gm else "graph"
    with compile_timer.graph(label):
        compile_timer.add("capture", float(gm.meta.get("kiln_capture_s", 0.0)) if is_gm else 0.0)
        if not enabled(config):
            return compile_fn()
        with compile_timer.phase("cache lookup"):
            try:
                key, names = graph_key(gm, example_inputs, config)
            except NotCacheable as e:
                log.debug("kiln: graph not cached: %s", e)
                counters["graph_cache_bypass"] += 1
                return compile_fn()
            # a hit's guard compiles again through the cache: a weight given new memory
            # (``p.data = other``) is then a hit that binds it, not a whole compile
            hit = _load(key, gm, names, config,
                        lambda: compile_cached(gm, example_inputs, config, compile_fn))
        if hit is not None:
            compile_timer.note("graph cache hit")
            return hit
        env = _shape_env(gm)
        before = _shape_env_state(env)
        with recording_scope() as rec:
            compiled = compile_fn()
        with compile_timer.phase("cache store"):
            reason = _why_not_stored(rec, before, _shape_env_state(env))
            if reason is None:
                try:
                    _store(key, rec, gm, names)
                except NotCacheable as e:
                    reason = str(e)
            if reason is not None:
                log.debug("kiln: graph not cached: %s", reason)
                counters["graph_cache_bypass"] += 1
        return compiled


def _why_not_stored(rec: Recording, shapes_before: str, shapes_after: str) -> str | None:
    if rec.not_cacheable:
        return rec.not_cacheable
    if shapes_before != shapes_after:
        return "its compile added shape guards"
    if rec.eager_reason is not None:
        return None if not rec.compiled else "it both compiled and ran eagerly"
    if len(rec.compiled) != 1:
        return f"it compiled {len(rec.compiled)} graphs (training graphs are not cached yet)"
    aten_gm = rec.compiled[0][0]
    if "kiln" not in getattr(aten_gm, "meta", {}):
        return "its ATen graph carries no output structure"
    return None


# ============================================================================ store / load


def _constant_sources(module, gm, names: GraphNames, folded: dict | None = None,
                      trace_constants: frozenset[str] = frozenset()) -> tuple[dict, list, bool]:
    """Where each graph constant comes from on a hit:

    - ``("attr", name)``: the live module tensor (normalized name);
    - ``("layout", name, stride)``: a copy of it in another layout, made at compile time (e.g.
      a conv weight stored channels-last); made again from the live tensor on a hit;
    - ``("folded", (which, names, eps), stride)``: a conv weight or bias with a BatchNorm
      folded in (``folded``: the fold's recipes by buffer name), in that layout; computed
      again from the live tensors on a hit with ``kiln.passes.folded_value`` (the same code
      as the fold; checked bit for bit against the compiled constant here);
    - ``("stored", i)``: a tensor the trace itself created (``torch.tensor(...)`` in the
      program), stored in the entry;
    - ``("derived", derivation, source, args)``: made by a registered derivation from graph
      constant ``source`` (``kiln_loopir.derived_constants``: a weight stored channels-last,
      a weight packed for MKL's GEMM, which is an opaque tensor that cannot be stored); made
      again on a hit from the source's value there.

    A constant computed from a parameter in any other way would bake the storing process's
    weights into the entry: such graphs are not cached.

    Also returns whether a stored tensor may hold weight values (then the entry is valid only
    for these weights). Only the trace's own constants (``trace_constants``) are known not to:
    the trace saw fake weights."""
    folded = folded or {}
    sched = module.meta.get("schedule") if hasattr(module, "meta") else None
    targets, recipes = {}, {}
    if sched is not None:
        for b in getattr(sched.graph, "constant_buffers", ()):
            targets[b.name] = b.target
            if getattr(b, "recipe", None) is not None:
                recipes[b.name] = b.recipe
    sources, stored, weight_valued = {}, [], False
    for name, value in module.constants.items():
        if name in recipes:
            derivation, source, args = recipes[name]
            if source not in module.constants:
                raise NotCacheable(f"constant {name} is derived from {source}, not a graph constant")
            sources[name] = ("derived", derivation, source, tuple(args))
            continue
        target = targets.get(name)
        if target in folded and isinstance(value, torch.Tensor):
            try:
                sources[name] = _folded_source(name, value, folded[target], gm, names)
                continue
            except NotCacheable as e:  # stored, under the weights' hash (kind by_weights)
                log.debug("kiln: folded constant %s stored with the entry: %s", name, e)
        norm = names.normalize(target) if target else None
        live = None
        if norm is not None:
            try:
                live = names.resolve(gm, norm)
            except AttributeError:
                live = None
        if not isinstance(live, torch.Tensor) or not isinstance(value, torch.Tensor):
            sources[name] = ("stored", len(stored))
            weight_valued = weight_valued or target not in trace_constants
            if isinstance(value, torch.Tensor):  # a view would save its whole storage
                value = value.detach()
                if value.untyped_storage().nbytes() > value.nbytes:
                    value = value.clone()
            stored.append(value)
        elif _same_tensor(live, value):
            sources[name] = ("attr", norm)
        elif (live.shape == value.shape and live.dtype == value.dtype
              and live.device == value.device and value.storage_offset() == 0
              and torch.equal(live.detach(), value)):
            sources[name] = ("layout", norm, tuple(value.stride()))
        else:
            raise NotCacheable(f"constant {name} is computed from parameter {target}")
    return sources, stored, weight_valued


def _folded_source(name: str, value: torch.Tensor, recipe: tuple, gm, names: GraphNames) -> tuple:
    which, qualnames, eps = recipe
    norms = tuple(None if q is None else names.normalize(q) for q in qualnames)
    if any(n is None and q is not None for n, q in zip(norms, qualnames, strict=True)):
        raise NotCacheable(f"constant {name} is folded from tensors outside the graph's names")
    recipe = (which, norms, eps)
    try:
        again = _fold_again(recipe, gm, names, tuple(value.stride()))
    except Exception as e:
        raise NotCacheable(f"constant {name} cannot be folded again ({type(e).__name__}: {e})") from e
    if (again.shape != value.shape or again.dtype != value.dtype or again.device != value.device
            or again.stride() != value.stride() or value.storage_offset() != 0
            or not torch.equal(again, value)):
        raise NotCacheable(f"constant {name} does not match its fold recipe")
    return ("folded", recipe, tuple(value.stride()))


def _fold_again(recipe: tuple, gm, names: GraphNames, stride: tuple) -> torch.Tensor:
    which, norms, eps = recipe
    tensors = []
    for norm in norms:
        t = None if norm is None else names.resolve(gm, norm)
        if norm is not None and not isinstance(t, torch.Tensor):
            raise _Stale(f"fold source {norm} is not a tensor here")
        tensors.append(None if t is None else t.detach())
    return folded_value(which, *tensors, eps, stride=stride)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
        and a.stride() == b.stride() and a.data_ptr() == b.data_ptr()
    )


def _weights_hash(gm) -> str:
    """A hash of the values of every parameter and buffer of ``gm`` (by name)."""
    h = hashlib.sha256()  # OpenSSL: SHA extensions make it the fastest here
    seen: set[int] = set()
    for name, t in itertools.chain(gm.named_parameters(), gm.named_buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(memoryview(data.numpy()))
    return h.hexdigest()


def _serialize(artifact: dict) -> bytes:
    buf = io.BytesIO()
    try:
        torch.save(artifact, buf)
    except Exception as e:  # a kernel meta or an output leaf that does not pickle
        raise NotCacheable(f"its artifact does not serialize ({type(e).__name__}: {e})") from e
    return buf.getvalue()


_writer: concurrent.futures.ThreadPoolExecutor | None = None
_pending: list[concurrent.futures.Future] = []
_pending_lock = threading.Lock()


def _in_background(fn: Callable[[], None]) -> None:
    """Serialize and write an entry off the compile's critical path (one writer thread; the
    interpreter waits for it at exit; ``flush()`` waits for it now)."""
    global _writer
    with _pending_lock:
        if _writer is None:
            _writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kiln-cache-store")
            run_before_capture(flush)  # no write may touch the device during a CUDA graph capture
        _pending[:] = [f for f in _pending if not f.done()]
        _pending.append(_writer.submit(fn))


def flush() -> None:
    """Wait until every graph-cache entry this process is writing is on disk (writes that
    failed were logged and are dropped)."""
    with _pending_lock:
        pending = list(_pending)
    concurrent.futures.wait(pending)


def _store(key: str, rec: Recording, gm, names: GraphNames) -> None:
    """Write the entry. An artifact holding tensors the compile computed (folded weights, a
    weight in another layout of a value we cannot tie to a parameter) is valid only for these
    weights: it goes under a key that adds their hash, and ``key`` holds a pointer to that.
    Tensors the trace itself made (``torch.empty(0)`` in the program) need no such key.
    What the entry holds is decided now; pickling and writing happen in the background."""
    if rec.eager_reason is not None:
        artifact = {"format": _FORMAT, "kind": "eager", "reason": rec.eager_reason}
        disk_cache.put(KIND, key, {ARTIFACT: _serialize(artifact)})
        return
    aten_gm, module, _ = rec.compiled[0]
    info = getattr(aten_gm, "meta", {}).get("kiln")
    trace_constants = frozenset(getattr(info, "trace_constants", ()))
    with _one_thread():  # it refolds each folded constant to check its recipe
        sources, stored, weight_valued = _constant_sources(module, gm, names, rec.folded, trace_constants)
    artifact = {
        "format": _FORMAT,
        "kind": "compiled",
        "wrapper_source": module.wrapper_source,
        "entry": module.entry,
        "codegen": module.codegen,
        "kernels": [(k.name, k.source, list(k.arg_names), dict(k.meta)) for k in module.kernels],
        "constants": sources,
        "stored_tensors": stored,
        "out_structure": out_structure(aten_gm),
        "facts": graph_facts(aten_gm),
    }
    weights_key = disk_cache.hash_key(key, _weights_hash(gm)) if weight_valued else None

    def write() -> None:
        try:
            data = _serialize(artifact)
            if weights_key is not None:
                pointer = {"format": _FORMAT, "kind": "by_weights"}
                disk_cache.put(KIND, key, {ARTIFACT: _serialize(pointer)})
            disk_cache.put(KIND, weights_key or key, {ARTIFACT: data})
        except Exception as e:
            log.warning("kiln: could not store a graph cache entry (%s: %s)", type(e).__name__, e)

    _in_background(write)


def _read(entry: Path) -> dict:
    with warnings.catch_warnings():  # pytree's deprecation notes while unpickling specs
        warnings.simplefilter("ignore", FutureWarning)
        artifact = torch.load(entry / ARTIFACT, weights_only=False)
    if not isinstance(artifact, dict) or artifact.get("format") != _FORMAT:
        raise _Stale(f"format {artifact.get('format') if isinstance(artifact, dict) else '?'}")
    return artifact


class _Stale(Exception):
    pass


def _load(key, gm, names, config, compile_fn) -> Callable | None:
    entry = disk_cache.get(KIND, key)
    by_weights = False
    try:
        if entry is not None and _read(entry)["kind"] == "by_weights":
            by_weights = True
            key = disk_cache.hash_key(key, _weights_hash(gm))
            entry = disk_cache.get(KIND, key)
        if entry is None:
            counters["graph_cache_misses"] += 1
            return None
        artifact = _read(entry)
        if artifact["kind"] == "eager":
            fn = run_eagerly(gm, artifact["reason"])
        else:
            fn = _rebuild(artifact, gm, names, config)
            tensors, owners, views = _derived_from(artifact["constants"], gm, names)
            if by_weights:  # stored under the hash of every weight: guard them all
                fn = WeightsGuard(fn, compile_fn, itertools.chain(gm.parameters(), gm.buffers()),
                                  gm.modules(), views=views)
            else:  # constants computed from some weights, or reading them: guard those
                fn = WeightsGuard.around(fn, compile_fn, tensors, owners, views=views)
    except Exception as e:
        log.warning("kiln: stale graph cache entry %s ignored (%s: %s); it is rebuilt",
                    entry, type(e).__name__, e)
        disk_cache.discard(KIND, key)
        counters["graph_cache_stale"] += 1
        counters["graph_cache_misses"] += 1
        return None
    counters["graph_cache_hits"] += 1
    return fn


def _derived_from(constants: dict, gm, names: GraphNames) -> tuple[list, list, list]:
    """(tensors, their owning modules, views) of a hit: the tensors its constants were
    computed from (the sources of layout copies and of folded BatchNorms, and the
    ``num_batches_tracked`` of those BatchNorms: their statistics change in training mode
    without a version bump), and the module tensors it binds as constants and reads in place
    (``attr``: a new memory for one, ``p.data = other``, must compile again)."""
    tensors, owners, seen, stats = [], [], set(), []
    views = {}
    for where, ref, *rest in constants.values():
        if where == "attr":
            live = names.resolve(gm, ref)
            if isinstance(live, torch.Tensor):
                views[id(live)] = live
            continue
        if where == "derived":  # guarded as the constant it starts from, taken as a copy of it
            where, ref, *rest = _derivation_root(constants, rest[0])
            if where == "attr":
                where = "layout"
        if where == "layout":
            norms = [ref]
        elif where == "folded":
            norms = [n for n in ref[1] if n is not None]
            stats += [names.resolve(gm, n) for n in ref[1][2:4]]  # running mean, var
        else:
            continue
        for norm in norms:
            head, *rest = norm.split(".")
            qualname = ".".join([names.from_norm[head], *rest])
            for obj in (names.resolve(gm, norm), gm.get_submodule(qualname.rpartition(".")[0])):
                if id(obj) not in seen:
                    seen.add(id(obj))
                    (owners if isinstance(obj, torch.nn.Module) else tensors).append(obj)
    for counter in batch_counters(stats, owners).values():
        if counter is None:
            raise _Stale("a folded BatchNorm's statistics belong to no module with num_batches_tracked")
        if id(counter) not in seen:
            seen.add(id(counter))
            tensors.append(counter)
    return tensors, owners, [t for k, t in views.items() if k not in seen]


def _rebuild(artifact: dict, gm, names: GraphNames, config: Options) -> Callable:
    from kiln_loopir.codegen_protocol import GeneratedModule, KernelDef

    codegen = codegen_by_name(artifact["codegen"], config)
    kernels = [KernelDef(n, src, list(args), meta=dict(meta))
               for n, src, args, meta in artifact["kernels"]]
    constants = {}
    with _one_thread():
        for name, (where, ref, *layout) in artifact["constants"].items():
            if where != "derived":
                constants[name] = _bound_constant(name, where, ref, layout, artifact, gm, names)
    for name in _derivation_order(artifact["constants"]):
        _, derivation, source, args = artifact["constants"][name]
        # an MKL-packed weight is packed for the threads it runs with: packed on one thread,
        # a hit's BERT-sized linears ran 1.5-2x slower than the compile that stored it
        with contextlib.nullcontext() if derivation in THREAD_TUNED else _one_thread():
            constants[name] = derive(derivation, constants[source], *args)
    module = GeneratedModule(
        wrapper_source=artifact["wrapper_source"],
        kernels=kernels,
        namespace_builder=lambda: codegen.finalize(kernels),
        constants=constants,
        codegen=artifact["codegen"],
        entry=artifact["entry"],
    )
    compiled = kiln_runtime.load(module, config)
    counters["graphs_compiled"] += 1  # a hit yields the same compiled graph
    counters["kernels_generated"] += len(kernels)
    return _finish(gm, compiled, artifact["facts"], artifact["out_structure"], config)


def _derivation_order(constants: dict) -> list[str]:
    """The derived constants, each after the derived constant it is made from."""
    order, done = [], {n for n, (where, *_) in constants.items() if where != "derived"}
    pending = [n for n in constants if n not in done]
    while pending:
        ready = [n for n in pending if constants[n][2] in done]
        if not ready:
            raise _Stale(f"derived constants {pending} have no source in the entry")
        order += ready
        done.update(ready)
        pending = [n for n in pending if n not in done]
    return order


def _derivation_root(constants: dict, name: str) -> tuple:
    """The entry of the constant a chain of derived constants starts from."""
    seen = set()
    while constants[name][0] == "derived":
        if name in seen:
            raise _Stale(f"derived constant {name} is derived from itself")
        seen.add(name)
        name = constants[name][2]
    return constants[name]


def _bound_constant(name: str, where: str, ref, layout: list, artifact: dict, gm,
                    names: GraphNames) -> Any:
    """The value a hit binds to graph constant ``name`` (``_constant_sources`` says where from)."""
    if where == "stored":
        return artifact["stored_tensors"][ref]
    if where == "folded":
        return _fold_again(ref, gm, names, tuple(layout[0]))
    value = names.resolve(gm, ref)
    if not isinstance(value, torch.Tensor):
        raise _Stale(f"constant {name} ({ref}) is not a tensor here")
    value = value.detach()
    if where == "layout":
        (stride,) = layout
        value = torch.empty_strided(value.shape, stride, dtype=value.dtype,
                                    device=value.device).copy_(value)
    return value


@contextlib.contextmanager
def _one_thread():
    """Run refolds and layout copies (a hit's, and the store's check of each recipe) on one
    intra-op thread: each is one small memory-bound pass, and on a loaded machine every parallel region waits for a descheduled
    worker (resnet18's 40 refolds: ~0.04 s on one thread, ~0.4 s on two busy cores)."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _finish(gm, compiled, facts: dict, out_structure, config: Options) -> Callable:
    """What ``compile_inference`` returns around a loaded graph: CUDA graphs (per mode), the
    torch-level output structure, the grad-mode guard."""
    try:  # KILN_LOGS=perf: per-kernel times (no eager comparison: the ATen graph was skipped)
        from kiln_runtime.profile import profiled

        compiled = profiled(compiled)
    except ImportError:
        pass
    flat = for_mode(compiled, facts, config)
    restore = structure_restorer(out_structure)

    def compiled_graph(*args):
        return restore(flat(*args))

    compiled_graph.flat = flat
    return inference_only(gm, compiled_graph)
