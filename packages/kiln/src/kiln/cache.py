"""The graph-level cache of the ``kiln`` backend: keys, get and put of Artifacts.

A second process (or a deployed copy) that compiles the same torch-level graph with the same
inputs, options and tool versions gets the stored ``Artifact`` (``kiln.artifact``) and skips
every stage: ``kiln.assemble`` loads its kernels (binaries from the kernel-level entries of
``kiln_runtime.disk_cache``) and binds the live module's weights, as it does for a fresh
compile.

**Key** (``key``, ``graph_key``): the normalized FX graph (placeholders, modules and
attributes renamed by order of appearance, ``kiln.names``; each called module described by
its type, plain attributes and the metadata of its tensors), the inputs' metadata (dtype,
shape with symbols, stride, storage offset, device, requires_grad, which inputs share
memory), the global state the trace bakes in (grad mode, default dtype, autocast,
determinism, matmul precision: ``_tracing_state_text``), the backend's ``Options``, and the
versions of kiln (a hash of its packages' sources: an edited checkout never hits an old
entry), Python, torch, triton (when installed), the C++ compiler (with the CPU's ISA flags)
and the CUDA devices.

**Entry** (kind ``graph``): ``artifact.pt``, the pickled Artifact. It holds no weight values
(constants are recipes), so its key needs no hash of them; an Artifact with a stored
constant that may hold weight values (``guards.all_weights``) goes under a key that adds a
hash of the weights' values, and the plain key holds a pointer to it. Entries are pickled
and written by a background thread (``flush()`` waits for it).

Not stored (logged on logger ``kiln.cache`` at DEBUG): graphs whose description holds an
object without a stable text (a lambda's address, a module hook), training graphs, graphs
whose compile added shape guards, and Artifacts that say why not (``unstorable``: kernels
that fell back to the interpreter, a constant without a recipe). ``KILN_COMPILE_DEBUG``
bypasses the cache (every debug file is written); ``KILN_GRAPH_CACHE=0`` turns it off.

The folder is trusted like code (entries are pickles, read with
``torch.load(weights_only=False)``): ``kiln_runtime.disk_cache`` refuses a folder others can
write (``UnsafeCacheDirWarning``) and loads nothing from it. A corrupt entry (a file that
fails its manifest) or a stale one (it unpickles to something else, or does not assemble:
``discard``) is logged, removed and rebuilt.
"""

from __future__ import annotations

import concurrent.futures
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

import torch
from kiln_runtime import disk_cache
from kiln_runtime.cudagraphs import run_before_capture

from .artifact import Artifact
from .codegens import codegen_packages, toolchains
from .names import GraphNames
from .options import Options
from .stats import counters

log = logging.getLogger("kiln.cache")

__all__ = ["ARTIFACT", "KIND", "Key", "NotCacheable", "discard", "enabled", "flush", "get",
           "graph_key", "key", "put"]

#: the disk-cache kind of graph-level artifacts
KIND = "graph"
ARTIFACT = "artifact.pt"
_FORMAT = 3
#: packages whose code decides what a graph compiles to (their sources are in the key), with
#: every loadable codegen's package (``codegens.codegen_packages``)
_KEYED_PACKAGES = (
    "kiln",
    "kiln_aotgrad",
    "kiln_loopir",
    "kiln_runtime",
)


class NotCacheable(Exception):
    """This graph cannot be keyed or stored; the message says why."""


def enabled(config: Options) -> bool:
    """On unless ``KILN_GRAPH_CACHE=0`` or the compile writes a debug folder."""
    flag = os.environ.get("KILN_GRAPH_CACHE", "1").strip().lower()
    return flag not in ("0", "false", "no", "off") and not config.debug_enabled


# ============================================================================ get and put


@dataclasses.dataclass
class Key:
    """A graph's cache key, its graph-relative names, and the shape guards before its
    compile (a compile that adds some is not stored: the frontend guards on them)."""

    digest: str
    names: GraphNames
    gm: torch.fx.GraphModule
    shapes_before: str


def key(gm, example_inputs: Sequence, config: Options) -> Key | None:
    """The key of compiling ``gm`` on ``example_inputs`` with ``config``, or None when the
    cache is off or the graph cannot be keyed (logged and counted as a bypass)."""
    if not enabled(config):
        return None
    try:
        digest, names = graph_key(gm, example_inputs, config)
    except NotCacheable as e:
        _bypass(str(e))
        return None
    return Key(digest, names, gm, _shape_env_state(_shape_env(gm)))


def get(k: Key) -> Artifact | None:
    """The stored Artifact under ``k`` (following a pointer to the entry keyed by the live
    weights' values), or None: a miss, or a corrupt or stale entry (removed)."""
    digest = k.digest
    entry = disk_cache.get(KIND, digest)
    try:
        if entry is not None and _read(entry) == "by_weights":
            digest = disk_cache.hash_key(digest, _weights_hash(k.gm))
            entry = disk_cache.get(KIND, digest)
        if entry is None:
            counters["graph_cache_misses"] += 1
            return None
        artifact = _read(entry)
        if not isinstance(artifact, Artifact):
            raise TypeError(f"the entry holds a {type(artifact).__name__}")
    except Exception as e:
        discard(k, e, digest)
        return None
    counters["graph_cache_hits"] += 1
    return artifact


def put(k: Key, artifact: Artifact) -> None:
    """Store ``artifact`` under ``k`` unless it says why not or the compile added shape
    guards. Pickling and writing happen in the background."""
    reason = artifact.unstorable
    if reason is None and _shape_env_state(_shape_env(k.gm)) != k.shapes_before:
        reason = "its compile added shape guards"
    if reason is not None:
        _bypass(reason)
        return
    weights_key = (disk_cache.hash_key(k.digest, _weights_hash(k.gm))
                   if artifact.guards.all_weights else None)

    def write() -> None:
        try:
            data = _serialize(artifact)
            if weights_key is not None:
                disk_cache.put(KIND, k.digest, {ARTIFACT: _serialize("by_weights")})
            disk_cache.put(KIND, weights_key or k.digest, {ARTIFACT: data})
        except Exception as e:
            log.warning("kiln: could not store a graph cache entry (%s: %s)", type(e).__name__, e)

    _in_background(write)


def discard(k: Key, error: BaseException, digest: str | None = None) -> None:
    """Remove a stale entry (it did not read back, or its Artifact did not assemble here)
    with one log line; the caller compiles it again."""
    log.warning("kiln: stale graph cache entry %s ignored (%s: %s); it is rebuilt",
                digest or k.digest, type(error).__name__, error)
    disk_cache.discard(KIND, digest or k.digest)
    if digest is not None and digest != k.digest:
        disk_cache.discard(KIND, k.digest)
    counters["graph_cache_stale"] += 1
    counters["graph_cache_misses"] += 1


def _bypass(reason: str) -> None:
    log.debug("kiln: graph not cached: %s", reason)
    counters["graph_cache_bypass"] += 1


def _read(entry: Path) -> Any:
    with warnings.catch_warnings():  # pytree's deprecation notes while unpickling specs
        warnings.simplefilter("ignore", FutureWarning)
        stored = torch.load(entry / ARTIFACT, weights_only=False)
    if not isinstance(stored, dict) or stored.get("format") != _FORMAT:
        raise ValueError(f"format {stored.get('format') if isinstance(stored, dict) else '?'}")
    return stored["artifact"]


def _serialize(artifact: Artifact | str) -> bytes:
    buf = io.BytesIO()
    torch.save({"format": _FORMAT, "artifact": artifact}, buf)
    return buf.getvalue()


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


# ============================================================================ the key


@functools.lru_cache(None)
def _sources_hash() -> str:
    """SHA-256 over the source files of kiln's compiler packages (not imported to find them)."""
    h = hashlib.sha256()
    for name in (*_KEYED_PACKAGES, *codegen_packages()):
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
        f"kiln={_sources_hash()}",
        f"device={_device_text(devices)}",
    ]
    parts += [f"{name}={text}" for name, text in sorted(_toolchains().items())]
    return "\n".join(parts)


@functools.lru_cache(None)
def _toolchains() -> dict[str, str]:
    return toolchains()


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


def normalized_graph(gm: torch.fx.GraphModule) -> tuple[str, GraphNames]:
    """The stable text of a torch-level graph and its renaming (see ``GraphNames``)."""
    names = GraphNames()
    node_names: dict[torch.fx.Node, str] = {}
    counter = itertools.count()
    lines: list[str] = []
    modules: dict[str, str] = {}
    regions: dict[Any, int] = {}

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
        call = f"({arg(n.args)[1:-1].rstrip(',')}; {arg(n.kwargs)})" + _recompute_text(n, regions)
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


def _recompute_text(n: torch.fx.Node, regions: dict[Any, int]) -> str:
    """An activation-checkpoint region's tag (it changes what the partition saves). A selective
    policy is a function whose closure no text captures: such graphs are not cached."""
    policy = n.meta.get("recompute")
    if policy is None:
        return ""
    if callable(policy):
        raise NotCacheable("a selective activation-checkpoint policy")
    region = regions.setdefault(n.meta.get("ac_graph_id"), len(regions))  # numbered per graph
    return f" @recompute({policy.name}, {region})"


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


