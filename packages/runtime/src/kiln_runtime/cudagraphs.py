"""CUDA graphs for compiled graphs (``mode="reduce-overhead"``): record once, replay cheaply.

``CudaGraphRunner(fn, name=...)`` wraps a compiled callable ``fn(list_of_inputs) ->
list[Tensor]`` (a ``CompiledGraph``'s ``call``):

1. The first call runs ``fn`` as is (warm-up: lazy initialization, autotuning, library
   handles) and checks that every tensor is on the engine's device.
2. Later calls look up an **entry** by the inputs' sizes, strides and dtypes. A new entry
   allocates static input buffers, copies the inputs in and records ``fn`` into a graph.
   Inputs named in ``static_inputs`` (parameters, buffers: stable addresses) are used in
   place; their addresses are part of the entry's signature.
3. **Outputs a user still holds are never overwritten.** Each entry has up to
   ``config.alias_slots`` recorded copies of the graph (slots), each with its own outputs.
   A call replays a slot none of whose outputs is still referenced (liveness: the use count
   of the output's storage against the count the runner itself holds) and hands out views of
   its outputs. When every slot's outputs are held, one more *copy slot* is replayed and its
   outputs are **copied out** (cloned) before they are returned, so it is never held either.
4. **One memory pool** per device is shared by every recorded graph (a model's graphs and
   their slots): a graph's temporaries reuse memory that another graph's temporaries used.
   The one hazard of sharing, a graph recorded *later* keeping its outputs where an earlier
   graph keeps its temporaries, is ruled out by bookkeeping: a slot is replayed only while no
   output of a slot recorded after it is held; otherwise a fresh slot is recorded, or the
   call runs without a graph.
5. **Dynamic shapes**: each new input signature records a new entry, at most
   ``config.max_recordings`` per runner; past that the runner logs once and calls ``fn``
   directly. With ``config.buckets`` (e.g. ``(1, 2, 4, 8, 16)``; ``KILN_CUDAGRAPH_BUCKETS``)
   and ``bucketed=True`` (the caller promises dim 0 of every tensor input is a batch whose rows
   are independent, and ``fn`` takes any size), dim 0 is padded with zeros up to the next
   bucket and outputs whose dim 0 is the bucket are sliced back.
6. **Skips** (``fn`` runs as is, the reason logged once on ``kiln.cudagraphs`` and counted in
   ``skips``): tensors not on the engine's device ("CPU tensors"), data-dependent shapes,
   mutated inputs that share memory with another input, a failed capture. Mutated inputs are
   otherwise handled: the static buffer's new value is copied back into the caller's tensor.

``recordings()`` lists every recorded graph with its device memory (``kiln.stats()`` shows
them). The graph engine is pluggable: ``CudaGraphEngine`` records with ``torch.cuda.CUDAGraph``;
tests drive the same bookkeeping on CPU with an engine whose "replay" reruns the function into
the recorded output buffers.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = [
    "CudaGraphConfig",
    "CudaGraphEngine",
    "CudaGraphRunner",
    "GraphEngine",
    "Recording",
    "config",
    "recordings",
    "reset",
    "skips",
]

log = logging.getLogger("kiln.cudagraphs")


def _env_buckets() -> tuple[int, ...] | None:
    raw = os.environ.get("KILN_CUDAGRAPH_BUCKETS", "").strip()
    if not raw:
        return None
    try:
        sizes = tuple(sorted({int(s) for s in raw.split(",") if s.strip()}))
    except ValueError as e:
        raise ValueError(f"KILN_CUDAGRAPH_BUCKETS must be comma-separated sizes, got {raw!r}") from e
    if not sizes or sizes[0] < 1:
        raise ValueError(f"KILN_CUDAGRAPH_BUCKETS sizes must be >= 1, got {raw!r}")
    return sizes


@dataclasses.dataclass
class CudaGraphConfig:
    """``buckets``: sizes dim 0 is padded up to (None: record each size as it comes);
    ``max_recordings``: input signatures recorded per runner; ``alias_slots``: replays whose
    outputs may be held at once before outputs are copied out."""

    buckets: tuple[int, ...] | None = dataclasses.field(default_factory=_env_buckets)
    max_recordings: int = 8
    alias_slots: int = 2


config = CudaGraphConfig()


@dataclasses.dataclass
class Recording:
    """One recorded graph: ``runner`` name, ``signature`` (input sizes), ``slot`` ("alias 0",
    "copy"), ``output_bytes`` (its outputs' memory), ``input_bytes`` (the entry's static
    inputs, counted on its first slot) and ``pool_bytes`` (memory the pool grew by)."""

    runner: str
    signature: str
    slot: str
    output_bytes: int
    input_bytes: int
    pool_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.output_bytes + self.input_bytes + self.pool_bytes


_recordings: list[Recording] = []
#: why graphs were not used: reason -> count (a runner counts each reason once)
skips: Counter[str] = Counter()
_lock = threading.Lock()


def recordings() -> list[Recording]:
    with _lock:
        return list(_recordings)


def reset() -> None:
    """Forget the records and skip counts (recorded graphs stay with their runners)."""
    with _lock:
        _recordings.clear()
    skips.clear()


# ============================================================================ engines


class GraphEngine(Protocol):
    """How graphs are recorded and replayed. ``device_type``: where inputs must live;
    ``pool``: the memory pool shared by everything it records."""

    device_type: str
    pool: Any

    def capture(self, fn: Callable, inputs: list) -> tuple[Any, list, int]:
        """Record ``fn(inputs)``: (graph handle, its outputs, bytes the pool grew by)."""
        ...

    def replay(self, handle: Any) -> None: ...


#: called before every capture: work another thread may be doing on the device (kiln's
#: graph-cache writer copies CUDA constants to the host) must finish first, since CUDA refuses
#: such calls while a stream captures and the failed call corrupts the capture
BEFORE_CAPTURE: list[Callable[[], None]] = []


def run_before_capture(hook: Callable[[], None]) -> None:
    """Register ``hook`` to run before every capture (once: a second registration is a no-op)."""
    if hook not in BEFORE_CAPTURE:
        BEFORE_CAPTURE.append(hook)


def _release_generator(device: torch.device) -> None:
    """After a capture that failed part-way, give the device's default generator a fresh copy
    of its state. A capture registers the generator as capturing and only a capture that
    ends cleanly unregisters it (torch <= 2.11 keeps one flag); left set, every later random
    op outside a capture fails with "Offset increment outside graph capture encountered
    unexpectedly". The copy keeps seed and offset, so the random stream goes on unchanged."""
    try:
        torch.cuda.synchronize(device)
    except RuntimeError:  # the failed capture's own error may resurface here; it was raised
        pass
    generator = torch.cuda.default_generators[device.index]
    generator.graphsafe_set_state(generator.clone_state())
    log.info("kiln: a CUDA graph capture failed on %s; its random generator was released", device)


class CudaGraphEngine:
    """``torch.cuda.CUDAGraph`` recording into one memory pool per device.

    A pool lives while a graph recorded into it does: when the last one is freed, torch's
    allocator retires the pool, and recording into its handle again trips an internal assert
    (``use_count > 0``). So the engine counts the live graphs of each pool and starts a fresh
    pool once none is left (``pool`` is looked up at each capture, not kept)."""

    device_type = "cuda"
    _pools: dict[int, Any] = {}  # device index -> the pool handle graphs record into now
    _live: Counter = Counter()  # pool handle -> graphs recorded into it, still alive

    def __init__(self, device: torch.device | int | None = None):
        index = torch.device("cuda" if device is None else device)
        if index.index is None:
            index = torch.device("cuda", torch.cuda.current_device())
        self.device = index

    @property
    def pool(self) -> Any:
        with _lock:
            if self.device.index not in self._pools:
                self._pools[self.device.index] = torch.cuda.graph_pool_handle()
            return self._pools[self.device.index]

    @classmethod
    def _graph_freed(cls, index: int, pool: Any) -> None:
        with _lock:
            cls._live[pool] -= 1
            if cls._live[pool] <= 0:
                del cls._live[pool]
                if cls._pools.get(index) == pool:  # retired by torch: the next capture starts anew
                    del cls._pools[index]

    def capture(self, fn: Callable, inputs: list) -> tuple[Any, list, int]:
        for hook in BEFORE_CAPTURE:
            hook()
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_reserved(self.device)
        pool = self.pool
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph, pool=pool):
                outputs = fn(list(inputs))
        except BaseException:
            _release_generator(self.device)
            with _lock:  # a pool no live graph holds is retired with the failed one
                if not self._live[pool] and self._pools.get(self.device.index) == pool:
                    del self._pools[self.device.index]
            raise
        with _lock:
            self._live[pool] += 1
        weakref.finalize(graph, CudaGraphEngine._graph_freed, self.device.index, pool)
        torch.cuda.synchronize(self.device)
        return graph, list(outputs), torch.cuda.memory_reserved(self.device) - before

    def replay(self, handle: Any) -> None:
        handle.replay()


# ============================================================================ bookkeeping


_storage_use_count = torch._C._storage_Use_Count


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr())


_capture_order = itertools.count()


class _Slot:
    """One recorded copy of a graph: its handle, outputs, and which of them are handed out as
    views (``graph`` outputs), copied (outputs that alias a static input buffer) or returned as
    is (outputs that alias a stable input)."""

    def __init__(self, handle: Any, outputs: list, kinds: list[str], label: str,
                 pool: _PoolSlots):
        self.handle = handle
        self.pool = pool  # the slots of the memory pool it was recorded into
        self.outputs = outputs
        self.kinds = kinds
        self.label = label
        self.order = next(_capture_order)
        #: every output is a graph output: handed out as ``detach()`` views, in one pass
        self.all_graph = all(kind == "graph" for kind in kinds)
        # per storage of a graph output: its StorageImpl address (stable: the slot holds the
        # outputs) and the use count the runner's own references give it. Read through the
        # address, a liveness check is one C call per storage with no storage object made
        reps: dict[tuple, torch.Tensor] = {}
        for out, kind in zip(outputs, kinds, strict=True):
            if kind == "graph":
                reps.setdefault(_storage_key(out), out)
        self.storages = [t.untyped_storage()._cdata for t in reps.values()]
        self.storage_bytes = sum(t.untyped_storage().nbytes() for t in reps.values())
        self.baselines = [(cdata, _storage_use_count(cdata)) for cdata in self.storages]

    def outputs_held(self) -> bool:
        """Whether a user still references an output (or a view of one) of the last replay."""
        for cdata, base in self.baselines:
            if _storage_use_count(cdata) > base:
                return True
        return False

    def output_bytes(self) -> int:
        return self.storage_bytes

    def __repr__(self) -> str:
        return f"<slot {self.label} #{self.order}: {len(self.outputs)} outputs>"


class _PoolRecord:
    """A slot as its pool remembers it: capture order, the slot (weakly) and weak references
    to its outputs' storages, which outlive the slot: a user may still hold an output of a
    dropped runner (a recompile), and that memory stays in the pool where an earlier graph's
    temporaries may go."""

    __slots__ = ("order", "slot", "storages")

    def __init__(self, slot: _Slot):
        self.order = slot.order
        self.slot = weakref.ref(slot)
        self.storages = [StorageWeakRef(t.untyped_storage()) for t, kind
                         in zip(slot.outputs, slot.kinds, strict=True) if kind == "graph"]

    def held(self) -> bool:
        slot = self.slot()
        if slot is not None:
            return slot.outputs_held()
        return any(_storage_use_count(w.cdata) > 0 for w in self.storages)

    def gone(self) -> bool:
        return self.slot() is None and all(w.expired() for w in self.storages)


class _PoolSlots:
    """The slots recorded into one pool whose outputs are handed out as views, in capture
    order. Copy slots are not listed: their outputs are cloned before anyone sees them."""

    def __init__(self) -> None:
        self.records: list[_PoolRecord] = []

    def add(self, slot: _Slot) -> None:
        self.records = [r for r in self.records if not r.gone()]
        self.records.append(_PoolRecord(slot))

    def later_outputs_held(self, slot: _Slot) -> bool:
        """Whether a slot recorded after ``slot`` has outputs a user holds (its outputs may
        sit where ``slot``'s temporaries go). Walks back from the newest: usually 0-2 steps."""
        order = slot.order
        for record in reversed(self.records):
            if record.order <= order:
                return False
            if record.held():
                return True
        return False


_pool_slots: dict[Any, _PoolSlots] = {}


def _slots_of_pool(pool: Any) -> _PoolSlots:
    key = pool if isinstance(pool, tuple | int | str) else id(pool)
    with _lock:
        return _pool_slots.setdefault(key, _PoolSlots())


@dataclasses.dataclass
class _Entry:
    signature: str  # the inputs as text (recordings, logs)
    static_inputs: list  # tensor buffers (None for stable and non-tensor inputs)
    padded: int | None  # the bucket dim 0 is padded to
    slots: list = dataclasses.field(default_factory=list)
    copy_slot: _Slot | None = None
    input_bytes: int = 0
    #: (input position, its static buffer, the buffer's address): the copies made per call
    copies: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.copies = [(i, buf, buf.data_ptr()) for i, buf in enumerate(self.static_inputs)
                       if buf is not None]


# ============================================================================ the runner


class CudaGraphRunner:
    """``runner(*inputs) -> list[Tensor]``, recording ``fn`` into graphs (module docstring).

    ``static_inputs``: positions of inputs with stable addresses (used in place);
    ``mutated_inputs``: positions the graph writes (copied back after a replay);
    ``bucketed``: dim 0 may be padded to ``config.buckets`` (``fn`` must take any size);
    ``skip_reason``: do not record at all (logged once), e.g. data-dependent shapes."""

    def __init__(
        self,
        fn: Callable[[list], list],
        *,
        name: str = "graph",
        engine: GraphEngine | None = None,
        static_inputs: Sequence[int] = (),
        mutated_inputs: Sequence[int] = (),
        bucketed: bool = False,
        skip_reason: str | None = None,
        settings: CudaGraphConfig | None = None,
    ):
        self.fn = fn
        self.name = name
        self._engine = engine
        self.static_inputs = frozenset(static_inputs)
        self.mutated_inputs = tuple(mutated_inputs)
        self.bucketed = bucketed
        self.settings = settings
        self.entries: dict[tuple, _Entry] = {}  # by ``_key``
        self.warmed_up = False
        self.skip_reason: str | None = None
        self._logged: set[str] = set()
        if skip_reason is not None:
            self._skip(skip_reason)

    def __repr__(self) -> str:
        state = f"skipped: {self.skip_reason}" if self.skip_reason else f"{len(self.entries)} entries"
        return f"<CudaGraphRunner {self.name}: {state}>"

    @property
    def config(self) -> CudaGraphConfig:
        return self.settings or config

    @property
    def engine(self) -> GraphEngine:
        if self._engine is None:
            self._engine = CudaGraphEngine()
        return self._engine

    # -- logging ------------------------------------------------------------------------
    def _skip(self, reason: str) -> None:
        self.skip_reason = reason
        skips[reason.split(":")[0]] += 1
        log.info("kiln: CUDA graphs skipped for %s: %s", self.name, reason)

    def _once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            skips[key] += 1
            log.info(message, *args)

    # -- calling ------------------------------------------------------------------------
    def __call__(self, *inputs: Any) -> list:
        """A replay: look up the entry by the inputs' sizes, strides and dtypes, copy the inputs
        in, pick a slot, replay it, hand out its outputs (each step a few C calls)."""
        if self.skip_reason is not None:
            return self.fn(list(inputs))
        if not self.warmed_up:
            return self._warm_up(inputs)
        if self.mutated_inputs and self._mutated_input_aliases(inputs):
            self._once("mutated input aliases another input",
                       "kiln: %s runs without a CUDA graph for this call: a mutated input shares "
                       "memory with another input", self.name)
            return self.fn(list(inputs))
        if self.bucketed:
            padded, real = self._bucket(inputs)
        else:
            padded = real = None
        key = self._key(inputs, padded)
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= self.config.max_recordings:
                self._once("re-recording limit",
                           "kiln: %s saw more than %d input signatures; new ones run without a "
                           "CUDA graph (set kiln_runtime.cudagraphs.config.buckets to pad sizes)",
                           self.name, self.config.max_recordings)
                return self.fn(list(inputs))
            entry = self._new_entry(key, inputs, padded)
            log.debug("kiln: %s records a CUDA graph for inputs %s", self.name, entry.signature)
        if entry.padded is None:
            for i, buf, address in entry.copies:
                x = inputs[i]
                if x.data_ptr() != address:
                    buf.copy_(x)
        else:
            self._copy_in_padded(entry, inputs, real)
        try:
            slot, copy_out = self._pick_slot(entry, inputs)
        except _CaptureFailed as e:
            self._skip(f"capture failed: {e}")
            return self.fn(list(inputs))
        if slot is None:
            self._once("outputs held",
                       "kiln: %s runs without a CUDA graph for this call: outputs of every "
                       "recorded copy are still held", self.name)
            return self.fn(list(inputs))
        self.engine.replay(slot.handle)
        if self.mutated_inputs:
            self._copy_back(entry, inputs, real)
        if slot.all_graph and not copy_out and entry.padded is None:
            return [out.detach() for out in slot.outputs]
        return self._hand_out(entry, slot, copy_out, real)

    def _warm_up(self, inputs: Sequence) -> list:
        outputs = self.fn(list(inputs))
        self.warmed_up = True
        device_type = self._engine.device_type if self._engine else CudaGraphEngine.device_type
        tensors = [t for t in (*inputs, *outputs) if isinstance(t, torch.Tensor)]
        if any(t.device.type != device_type for t in tensors):
            self._skip(f"CPU tensors: a graph input or output is not on {device_type}")
        elif len({t.device for t in tensors}) > 1:
            self._skip("tensors on several devices")
        elif self._engine is None and tensors:
            self._engine = CudaGraphEngine(tensors[0].device)
        return outputs

    # -- steps --------------------------------------------------------------------------
    def _mutated_input_aliases(self, inputs: Sequence) -> bool:
        keys = Counter(_storage_key(t) for t in inputs if isinstance(t, torch.Tensor))
        return any(isinstance(inputs[i], torch.Tensor) and keys[_storage_key(inputs[i])] > 1
                   for i in self.mutated_inputs)

    def _key(self, inputs: Sequence, padded: int | None) -> tuple:
        """The entry key: per input, (sizes, strides, dtype) of a tensor (a static input adds
        its address; with padding, dim 0 is the bucket and strides are contiguous), the repr
        of anything else. Built from a few C calls per input, no text."""
        if padded is None and not self.static_inputs:
            return tuple([(x.shape, x.stride(), x.dtype) if isinstance(x, torch.Tensor)
                          else repr(x) for x in inputs])
        key = []
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                key.append(repr(x))
            elif i in self.static_inputs:
                key.append((x.shape, x.stride(), x.dtype, x.data_ptr()))
            elif padded is not None and x.dim() > 0:
                key.append(((padded, *x.shape[1:]), "c", x.dtype))
            else:
                key.append((x.shape, x.stride(), x.dtype))
        return tuple(key)

    def _bucket(self, inputs: Sequence) -> tuple[int | None, int | None]:
        """(padded dim-0 size, real dim-0 size), or (None, None) when not bucketing."""
        buckets = self.config.buckets
        if not self.bucketed or not buckets:
            return None, None
        dims = {t.shape[0] for i, t in enumerate(inputs)
                if isinstance(t, torch.Tensor) and i not in self.static_inputs and t.dim() > 0}
        if len(dims) != 1:
            return None, None
        (real,) = dims
        padded = next((b for b in buckets if b >= real), None)
        if padded is None or any(isinstance(t, torch.Tensor) and not t.is_contiguous()
                                 for i, t in enumerate(inputs) if i not in self.static_inputs):
            return None, None
        return padded, real

    def _signature(self, inputs: Sequence, padded: int | None) -> str:
        parts = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                shape = list(x.shape)
                if padded is not None and i not in self.static_inputs and shape:
                    shape[0] = padded
                where = f"@{x.data_ptr():#x}" if i in self.static_inputs else ""
                stride = "c" if padded is not None else tuple(x.stride())
                parts.append(f"{x.dtype}{shape}{stride}{where}")
            else:
                parts.append(repr(x))
        return ", ".join(parts)

    def _new_entry(self, key: tuple, inputs: Sequence, padded: int | None) -> _Entry:
        static, nbytes = [], 0
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor) or i in self.static_inputs:
                static.append(None)
                continue
            if padded is not None and x.dim() > 0:
                buf = torch.zeros((padded, *x.shape[1:]), dtype=x.dtype, device=x.device)
            else:
                buf = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            static.append(buf)
            nbytes += buf.untyped_storage().nbytes()
        entry = _Entry(self._signature(inputs, padded), static, padded, input_bytes=nbytes)
        self.entries[key] = entry
        return entry

    def _graph_inputs(self, entry: _Entry, inputs: Sequence) -> list:
        return [inputs[i] if buf is None else buf for i, buf in enumerate(entry.static_inputs)]

    def _copy_in_padded(self, entry: _Entry, inputs: Sequence, real: int | None) -> None:
        for i, buf, address in entry.copies:
            x = inputs[i]
            if x.data_ptr() == address:
                continue
            if real is not None and buf.dim() > 0:
                buf[:real].copy_(x)
                if real < entry.padded:
                    buf[real:].zero_()
            else:
                buf.copy_(x)

    def _copy_back(self, entry: _Entry, inputs: Sequence, real: int | None) -> None:
        for i in self.mutated_inputs:
            buf = entry.static_inputs[i]
            if buf is None or inputs[i].data_ptr() == buf.data_ptr():
                continue
            inputs[i].copy_(buf[:real] if real is not None and entry.padded is not None else buf)

    def _pick_slot(self, entry: _Entry, inputs: Sequence) -> tuple[_Slot | None, bool]:
        """(slot to replay, whether its outputs are copied out)."""
        for slot in entry.slots:
            if not slot.outputs_held() and not slot.pool.later_outputs_held(slot):
                return slot, False
        if len(entry.slots) < self.config.alias_slots:
            slot = self._record(entry, f"alias {len(entry.slots)}", inputs)
            entry.slots.append(slot)
            return slot, False
        if entry.copy_slot is None:
            entry.copy_slot = self._record(entry, "copy", inputs)
        if entry.copy_slot.pool.later_outputs_held(entry.copy_slot):
            return None, True
        return entry.copy_slot, True

    def _record(self, entry: _Entry, label: str, inputs: Sequence) -> _Slot:
        # stable inputs are recorded in place (their addresses are in the entry's signature)
        graph_inputs = self._graph_inputs(entry, inputs)
        pool = _slots_of_pool(self.engine.pool)  # the pool this capture records into
        try:
            handle, outputs, pool_bytes = self.engine.capture(self.fn, graph_inputs)
        except Exception as e:  # e.g. a synchronizing op inside the capture
            raise _CaptureFailed(f"{type(e).__name__}: {e}") from e
        kinds = self._output_kinds(entry, graph_inputs, outputs)
        slot = _Slot(handle, outputs, kinds, label, pool)
        if label != "copy":  # a copy slot's outputs are cloned at once: never held
            pool.add(slot)
        record = Recording(
            runner=self.name,
            signature=entry.signature,
            slot=label,
            output_bytes=slot.output_bytes(),
            input_bytes=entry.input_bytes if not entry.slots and entry.copy_slot is None else 0,
            pool_bytes=max(int(pool_bytes), 0),
        )
        with _lock:
            _recordings.append(record)
        return slot

    def _output_kinds(self, entry: _Entry, graph_inputs: list, outputs: list) -> list[str]:
        copied = {_storage_key(b) for b in entry.static_inputs if b is not None}
        stable = {_storage_key(x) for i, x in enumerate(graph_inputs)
                  if isinstance(x, torch.Tensor) and entry.static_inputs[i] is None}
        kinds = []
        for out in outputs:
            if not isinstance(out, torch.Tensor):
                kinds.append("value")
            elif _storage_key(out) in copied:
                kinds.append("copy")
            elif _storage_key(out) in stable:
                kinds.append("stable")
            else:
                kinds.append("graph")
        return kinds

    def _hand_out(self, entry: _Entry, slot: _Slot, copy_out: bool, real: int | None) -> list:
        result = []
        for out, kind in zip(slot.outputs, slot.kinds, strict=True):
            if kind in ("value", "stable"):
                result.append(out)
                continue
            view = out
            if real is not None and entry.padded is not None and out.dim() > 0 \
                    and out.shape[0] == entry.padded:
                view = out[:real]
            if copy_out or kind == "copy":
                result.append(view.clone())
            else:
                result.append(view.detach() if view is out else view)
        return result


class _CaptureFailed(RuntimeError):
    pass
