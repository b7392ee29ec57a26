"""What a cache entry keeps alive, and when it goes.

**Globals.** Capture installs objects in the frame's module globals under names its
generated code and guards read (``__compiled_fn_N``, ``__resume_at_*``,
``___kiln_const_N``, ``___kiln_pinned_<id>``, ...: ``OutputGraph.install_global`` tells
``installed``). A name belongs to the entries whose code can load it: the entry's
transformed code, the code nested in it, the code of the installed functions it loads
(a re-entry function loads a resume function, which may load a grad-mode class), and the
globals its guards read. Names are refcounted by entry: each entry's transformed code
object is a user of the names it reads, held weakly; when the last user of a name dies
(the entry was dropped by ``reset``, ``clear_cache`` or a dead identity key, and no frame
still runs its code), the name is deleted from the globals, and with it the graph and
what the graph holds (the model's modules). A name installed by a capture that made no
entry (a restart, a frame that ends uncaptured) is deleted when the capture ends. Names
are deleted only while no capture runs on any thread (a capture in progress may already
have decided to reuse an installed name), so a deletion that comes due during one waits
for its end.

**Identity keys.** Guards that fix an object by identity (ID_MATCH, FUNCTION_MATCH,
NN_MODULE) compare its ``id``, and a module used as a dict key is held as a ``WeakKey``.
Once such an object dies, the entry can never pass again, and worse, a new object at the
same address would pass the id check. So each entry holds weak references to these
objects (found by reading each guard's source on the inputs it was compiled for); when
one dies, the entry is dropped from its code's cache at once (``_evalframe.drop_entry``).
"""

from __future__ import annotations

import contextlib
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import _evalframe as _C
from .guards import Guard, GuardKind
from .sources import (
    AttrSource,
    ClosureSource,
    DictKeySource,
    GetItemSource,
    GlobalSource,
    LocalSource,
    ModuleSource,
    NNModuleMemberSource,
    Source,
    WeakKey,
    strong_key,
)

# ---------------------------------------------------------------------------------------
# Installed globals, refcounted by the entries whose code reads them
# ---------------------------------------------------------------------------------------


class _Installed:
    """The names capture installed in one globals dict: name -> the codes reading it."""

    __slots__ = ("globals", "users")

    def __init__(self, globals_: dict[str, Any]):
        self.globals = globals_  # held while a name is installed: the entries hold it too
        self.users: dict[str, set[int]] = {}


#: the installed functions that are kiln's generated code (translator.py)
_GENERATED_FUNCTIONS = ("__resume_at_", "__kiln_reenter_at_")
#: id(globals dict) -> its installed names (dicts cannot be weakly referenced)
_installed: dict[int, _Installed] = {}
#: id(transformed code) -> (its weak reference, the (globals id, name) pairs it reads)
_users: dict[int, tuple[weakref.ref, list[tuple[int, str]]]] = {}
#: captures running now (any thread); deletions wait until none is
_capturing = 0
#: (globals id, name) installed or released while a capture ran: checked when none runs
_pending: set[tuple[int, str]] = set()
_lock = threading.RLock()


def installed(globals_: dict[str, Any], name: str) -> None:
    """Capture installed ``globals_[name]`` (``OutputGraph.install_global``)."""
    with _lock:
        record = _installed.get(id(globals_))
        if record is None:
            record = _installed[id(globals_)] = _Installed(globals_)
        record.users.setdefault(name, set())
        _pending.add((id(globals_), name))


def installed_names(globals_: dict[str, Any]) -> dict[str, int]:
    """The names installed in ``globals_`` still held, with how many entry codes read each."""
    record = _installed.get(id(globals_))
    return {} if record is None else {n: len(u) for n, u in record.users.items()}


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Around one capture: installed names nobody claimed, and names whose last user died
    meanwhile, are deleted when the last capture running ends."""
    global _capturing
    with _lock:
        _capturing += 1
    try:
        yield
    finally:
        with _lock:
            _capturing -= 1
            if _capturing == 0:
                _settle()


_settling = False


def _settle() -> None:
    """Delete the pending names nobody reads. Not re-entered: a deletion that drops a
    resume function's entries releases their names into ``_pending``, for this loop."""
    global _settling
    if _settling:
        return
    _settling = True
    try:
        _settle_pending()
    finally:
        _settling = False


def _settle_pending() -> None:
    while _pending:
        key, name = _pending.pop()
        record = _installed.get(key)
        if record is None or record.users.get(name, True):
            continue  # gone already, or still read by a live entry
        del record.users[name]
        value = record.globals.pop(name, None)
        if isinstance(value, types.FunctionType) and name.startswith(_GENERATED_FUNCTIONS):
            # nothing can call it now: its own entries (a resume function's graphs) go too
            _C.clear_cache(value.__code__)
        if not record.users and _installed.get(key) is record:
            del _installed[key]


def _release(code_id: int) -> None:
    """The transformed code ``code_id`` died: its names lose a user."""
    with _lock:
        user = _users.pop(code_id, None)
        if user is None:
            return
        for key, name in user[1]:
            record = _installed.get(key)
            if record is not None and name in record.users:
                record.users[name].discard(code_id)
                if not record.users[name]:
                    _pending.add((key, name))
        if _capturing == 0:
            _settle()


def _code_names(code: types.CodeType, out: set[str]) -> None:
    out.update(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_names(const, out)


def _source_globals(source: Any, out: set[str], seen: set[int]) -> None:
    """The global names a source (and any source inside it) reads; ``seen``: the sources
    already walked (guards share their bases)."""
    while source is not None and id(source) not in seen:
        seen.add(id(source))
        if isinstance(source, GlobalSource):
            out.add(source.global_name)
            return
        base = getattr(source, "base_source", None)
        for value in getattr(source, "__dict__", {}).values():
            if value is not base and isinstance(value, Source):  # IdentitySource's other
                _source_globals(value, out, seen)
        source = base


def names_read(code: types.CodeType, guards: Iterable[Guard],
               globals_: dict[str, Any]) -> set[str]:
    """The installed names of ``globals_`` that an entry with this transformed code and
    these guards can read: through its code, the code nested in it and, transitively, the
    code of the installed functions it loads."""
    record = _installed.get(id(globals_))
    if record is None:
        return set()
    seen: set[str] = set()
    candidates: set[str] = set()
    _code_names(code, candidates)
    walked: set[int] = set()
    for g in guards:
        if g.source is not None:
            _source_globals(g.source, candidates, walked)
    todo = [n for n in candidates if n in record.users]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        value = globals_.get(name)
        if isinstance(value, types.FunctionType) and value.__globals__ is globals_:
            more: set[str] = set()
            _code_names(value.__code__, more)
            todo.extend(n for n in more if n in record.users and n not in seen)
    return seen


def claim(code: types.CodeType, guards: Iterable[Guard], globals_: dict[str, Any]) -> None:
    """The entry whose transformed code is ``code`` reads installed names: they stay while
    ``code`` lives."""
    with _lock:
        names = names_read(code, guards, globals_)
        if not names or id(code) in _users:
            return
        key = id(globals_)
        record = _installed[key]
        for name in names:
            record.users[name].add(id(code))
        code_id = id(code)
        ref = weakref.ref(code, lambda _r, code_id=code_id: _release(code_id))
        _users[code_id] = (ref, [(key, n) for n in names])


# ---------------------------------------------------------------------------------------
# Identity keys: the objects an entry's guards fix by identity, held weakly
# ---------------------------------------------------------------------------------------

_IDENTITY_KINDS = (GuardKind.ID_MATCH, GuardKind.FUNCTION_MATCH, GuardKind.NN_MODULE)


class _Frame:
    """What sources are read from: the frame's argument slots, globals and closure."""

    __slots__ = ("slots", "args", "globals", "closure")

    def __init__(self, arg_names, args, globals_, closure):
        self.slots = {n: i for i, n in enumerate(arg_names)}
        self.args = args
        self.globals = globals_
        self.closure = closure


_MISSING = object()
#: Source type -> how its value is read (``_MISSING``: cannot be read here)
_SOURCE_VALUES: dict[type, Callable[[Any, _Frame, Callable[[Source], Any]], Any]] = {}


def _value_rule(*types_: type) -> Callable:
    def register(fn: Callable) -> Callable:
        for t in types_:
            if t in _SOURCE_VALUES:
                raise ValueError(f"entry_lifetime: a value rule for {t.__name__} exists")
            _SOURCE_VALUES[t] = fn
        return fn

    return register


@_value_rule(LocalSource)
def _local_value(src: LocalSource, f: _Frame, base: Callable) -> Any:
    slot = f.slots.get(src.local_name)
    return _MISSING if slot is None else f.args[slot]


@_value_rule(ClosureSource)
def _closure_value(src: ClosureSource, f: _Frame, base: Callable) -> Any:
    if src.index < 0 or not isinstance(f.closure, tuple) or src.index >= len(f.closure):
        return _MISSING
    return f.closure[src.index].cell_contents


@_value_rule(GlobalSource, ModuleSource)
def _global_value(src: GlobalSource, f: _Frame, base: Callable) -> Any:
    return f.globals.get(src.global_name, _MISSING)


@_value_rule(AttrSource)
def _attr_value(src: AttrSource, f: _Frame, base: Callable) -> Any:
    return getattr(base(src.base_source), src.member)


@_value_rule(GetItemSource)
def _item_value(src: GetItemSource, f: _Frame, base: Callable) -> Any:
    return base(src.base_source)[strong_key(src.index)]


@_value_rule(DictKeySource)
def _dict_key_value(src: DictKeySource, f: _Frame, base: Callable) -> Any:
    return list(base(src.base_source).keys())[src.index]


@_value_rule(NNModuleMemberSource)
def _module_member_value(src: NNModuleMemberSource, f: _Frame, base: Callable) -> Any:
    return getattr(base(src.base_source), src.table)[src.member]


def identity_objects(guards: Iterable[Guard], arg_names: list[str], args: tuple,
                     globals_: dict[str, Any], closure: Any) -> list[Any]:
    """The objects ``guards`` fix by identity, read from their sources on the inputs the
    entry was compiled for (a guard whose source cannot be read here, or whose value is no
    longer the one seen, contributes nothing), and the objects of weakly held dict keys."""
    frame = _Frame(arg_names, args, globals_, closure)
    memo: dict[Source, Any] = {}

    def value(src: Source) -> Any:
        if src in memo:
            got = memo[src]
        else:
            rule = _SOURCE_VALUES.get(type(src))
            got = _MISSING
            if rule is not None:
                try:
                    got = rule(src, frame, value)
                except Exception:  # noqa: BLE001 - an unreadable source gives no key
                    got = _MISSING
            memo[src] = got
        if got is _MISSING:
            raise LookupError(src)
        return got

    found: dict[int, Any] = {}
    for g in guards:
        if g.kind is GuardKind.DICT_KEYS:
            for k in g.expected[1]:
                if type(k) is WeakKey and k.ref() is not None:
                    found[k.ident] = k.ref()
            continue
        if g.kind not in _IDENTITY_KINDS or g.source is None:
            continue
        expected = g.expected[0] if g.kind is GuardKind.NN_MODULE else g.expected
        if type(expected) is not int or expected in found:
            continue
        try:
            obj = value(g.source)
        except LookupError:
            continue
        if id(obj) == expected:
            found[expected] = obj
    return list(found.values())


def hold_weakly(check_fn: Any, code: types.CodeType, objects: Iterable[Any]) -> int:
    """Drop ``code``'s entry whose check is ``check_fn`` when any of ``objects`` dies.

    The weak references hang on ``check_fn`` (they go with the entry); their callback holds
    the code weakly and the check by id (valid: the check is alive while they are)."""
    code_ref = weakref.ref(code)
    check_id = id(check_fn)
    # bound now: at interpreter exit module globals are cleared before the last objects die
    cache_entries, drop_entry = _C.cache_entries, _C.drop_entry

    def died(_ref: Any) -> None:
        owner = code_ref()
        if owner is None:
            return
        for entry in cache_entries(owner):
            if id(entry[0]) == check_id:
                drop_entry(owner, entry[0])
                return

    refs = []
    for obj in objects:
        try:
            refs.append(weakref.ref(obj, died))
        except TypeError:  # not weakly referable (a builtin function, an int)
            continue
    check_fn.identity_keys = refs
    return len(refs)


__all__ = ["capturing", "claim", "hold_weakly", "identity_objects", "installed",
           "installed_names", "names_read"]
