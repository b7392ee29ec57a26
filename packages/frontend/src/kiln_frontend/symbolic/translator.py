"""The symbolic interpreter: walks a frame's bytecode with variable trackers.

* ``InstructionTranslatorBase`` holds the interpreter state (stack, symbolic locals,
  instruction pointer) and the helpers opcode handlers use.  Handlers live in
  ``symbolic/handlers/`` (one module per family) and are found through ``registry.lookup``.
* ``InstructionTranslator`` runs the frame itself: at ``RETURN_VALUE`` it compiles the graph
  and emits the transformed code; when something cannot be captured it *graph-breaks*
  (compile the graph so far, run the unsupported instruction in Python, continue in a
  generated resume function).
* ``InliningInstructionTranslator`` runs a called user function inside the same graph; it
  cannot break: it raises ``Unsupported`` and the caller breaks at its call instead.
"""

from __future__ import annotations

import inspect
import itertools
import linecache
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..bytecode import (
    BytecodeError,
    builders,
    create_instruction,
    decode,
    make_reentry_code,
    make_resume_code,
    versions,
)
from ..exc import Unsupported
from ..layers import upper
from ..sources import (
    BuiltinSource,
    ClosureSource,
    GlobalSource,
    LocalSource,
    ModuleSource,
    Source,
    module_global_name,
)
from . import registry
from .codegen import PyCodegen, walk_trackers
from .liveness import live_variables
from .output_graph import OutputGraph
from .restarts import RefusalRestart, RequiresGradRestart, RestartAnalysis
from .variables import (
    ConstantVariable,
    NullVariable,
    TensorVariable,
    VariableBuilder,
    VariableTracker,
)
from .variables.misc import (
    DeletedVariable,
    LazyVariable,
    LocalCellVariable,
    load_real_cell,
)
from .variables.raising import TracedException

_resume_counter = itertools.count(1)
#: original code -> {(target offset, stack layout, live locals): (name, code, function)}:
#: a frame recompiled (new shapes, ...) reuses its resume functions, so their own cache
#: entries accumulate on one code object
_resume_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: how deep user functions may be inlined when ``config.inline_depth_limit`` is not set
MAX_INLINE_DEPTH = 24
#: how many instructions one frame may interpret (unrolled loops included)
MAX_STEPS = 200_000

_CALL_OPNAMES = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX"})
_NEVER_BREAK_AT = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_CONST", "LOAD_DEREF",
                             "LOAD_CLOSURE", "PUSH_NULL", "NOP", "RESUME", "COPY_FREE_VARS",
                             "MAKE_CELL", "STORE_FAST", "POP_TOP", "COPY", "SWAP",
                             "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST",
                             "STORE_FAST_STORE_FAST"})
_CALL_PREFIX_OPNAMES = frozenset({"PRECALL", "KW_NAMES"})


def num_argument_slots(code: types.CodeType) -> int:
    import inspect

    n = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        n += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        n += 1
    return n


@upper.provide
class InstructionTranslatorBase:
    """Interpreter state and the helpers opcode handlers call."""

    def __init__(self, *, code: types.CodeType, f_globals: dict[str, Any],
                 f_builtins: dict[str, Any], symbolic_locals: dict[str, VariableTracker],
                 closure_cells: dict[str, VariableTracker], output: OutputGraph,
                 parent: InstructionTranslatorBase | None = None):
        self.code = code
        self.instructions = decode(code)
        self.index_of = {id(inst): i for i, inst in enumerate(self.instructions)}
        self.f_globals = f_globals
        self.f_builtins = f_builtins
        self.symbolic_locals = symbolic_locals
        self.closure_cells = closure_cells
        #: cells MAKE_CELL made after the prologue (3.12's inlined comprehensions), by name,
        #: while the frame's slot holds them (``FreshCellVariable``)
        self.fresh_cells: dict[str, VariableTracker] = {}
        #: cell variables whose slot an inlined comprehension filled with a plain value
        #: (STORE_FAST): LOAD_FAST reads that value, not the cell, until the cell is put back
        self.plain_slots: set[str] = set()
        self.output = output
        self.parent = parent
        self._liveness: list[frozenset[str]] | None = None
        self.depth = 0 if parent is None else parent.depth + 1
        self.stack: list[VariableTracker] = []
        self.ip = 0
        self.current_inst = None
        self.kw_names: tuple[str, ...] | None = None
        #: KW_NAMES / PRECALL seen since the last call (replayed when a call breaks)
        self.call_prefix: list = []
        self.done = False

    def live_locals(self, index: int) -> list[str]:
        """Plain locals (not cells) live at instruction ``index`` that have values now,
        in co_varnames order."""
        if self._liveness is None:
            self._liveness = live_variables(self.instructions)
        live = self._liveness[index] if index < len(self.instructions) else frozenset()
        cells = set(self.code.co_cellvars) | set(self.code.co_freevars)
        out = []
        for name in self.code.co_varnames:
            if name in live and name not in cells and name in self.symbolic_locals:
                if isinstance(self.symbolic_locals[name], DeletedVariable):
                    continue
                out.append(name)
        return out

    # -- stack ------------------------------------------------------------------------

    def push(self, value: VariableTracker) -> None:
        assert isinstance(value, VariableTracker), value
        self.stack.append(value)

    def pop(self) -> VariableTracker:
        if not self.stack:
            raise Unsupported("stack underflow while tracing (internal error)")
        return self.stack.pop()

    def popn(self, n: int) -> list[VariableTracker]:
        if n == 0:
            return []
        if len(self.stack) < n:
            raise Unsupported("stack underflow while tracing (internal error)")
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def peek(self, n: int = 1) -> VariableTracker:
        return self.stack[-n]

    def jump(self, inst) -> None:
        self.ip = self.index_of[id(inst.target)]

    # -- running ----------------------------------------------------------------------

    def location(self, inst) -> tuple[str, int | None, str | None]:
        filename = self.code.co_filename
        lineno = inst.lineno if inst is not None else None
        text = None
        if lineno is not None:
            text = linecache.getline(filename, lineno).strip() or None
            if text and text.endswith(":"):
                text = text[:-1].rstrip()
        return filename, lineno, text

    def step(self) -> None:
        if self.ip >= len(self.instructions):
            raise Unsupported("ran past the end of the code (internal error)")
        inst = self.instructions[self.ip]
        self.ip += 1
        self.current_inst = inst
        self.output.steps += 1
        if self.output.steps > MAX_STEPS:
            raise Unsupported(f"traced more than {MAX_STEPS} instructions (a long loop?)")
        try:
            registry.lookup(inst.opname)(self, inst)
        except TracedException as e:  # a traced `raise`: to its `except`, if traced here
            if not self.jump_to_handler(inst, e):
                raise

    def jump_to_handler(self, inst, error: TracedException) -> bool:
        """Jump to the handler of ``inst`` for ``error`` (True), or leave it to the caller
        (False: no handler in this code); trackers throwing into a paused generator call it
        on the generator's translator."""
        from .handlers.exceptions import handle_traced_exception

        return handle_traced_exception(self, inst, error)

    def run(self) -> None:
        while not self.done:
            try:
                self.step()
            except Unsupported as e:
                e.with_location(*self.location(self.current_inst))
                raise

    # -- values -----------------------------------------------------------------------

    def wrap_value(self, value: Any, source: Source | None, *,
                   guard: bool = True) -> VariableTracker:
        return VariableBuilder(self, source, guard=guard)(value)

    def realize(self, value: VariableTracker) -> VariableTracker:
        if isinstance(value, LazyVariable):
            return value.realize(self)
        return value

    def global_source(self, name: str) -> Source | None:
        root = self.root()
        if self.f_globals is root.f_globals:
            return GlobalSource(name)
        mod_name = self.f_globals.get("__name__")
        import sys

        module = sys.modules.get(mod_name) if isinstance(mod_name, str) else None
        if module is None or getattr(module, "__dict__", None) is not self.f_globals:
            return None
        gname = module_global_name(module)
        if root.f_globals.get(gname) is not module:
            self.output.install_global(gname, module)
        from ..sources import AttrSource

        return AttrSource(ModuleSource(gname), name)

    def load_global(self, name: str) -> VariableTracker:
        stored = self.output.side_effects.load_global(self, name)
        if stored is not None:  # the frame wrote it (STORE_GLOBAL): no guard, its value
            return stored
        if name in self.f_globals:
            return self.wrap_value(self.f_globals[name], self.global_source(name))
        builtins_dict = self.f_builtins
        if name in builtins_dict:
            src = BuiltinSource(name) if self.f_globals is self.root().f_globals else None
            return self.wrap_value(builtins_dict[name], src)
        raise Unsupported(f"NameError: name {name!r} is not defined")

    def root(self) -> InstructionTranslatorBase:
        tx = self
        while tx.parent is not None:
            tx = tx.parent
        return tx

    def getattr(self, obj: VariableTracker, name: str) -> VariableTracker:
        obj = self.realize(obj)
        stored = self.output.side_effects.load_attr(obj, name)
        if stored is not None:  # the frame assigned it (see side_effects.py)
            return stored
        return obj.var_getattr(self, name)

    def getitem(self, obj: VariableTracker, index: VariableTracker) -> VariableTracker:
        import operator

        from .variables.nn_module import NNModuleVariable

        obj = self.realize(obj)
        if isinstance(obj, TensorVariable):
            from ..shapes import SymNodeVariable

            index = self.realize(index)
            if isinstance(index, SymNodeVariable) and index.python_type() is int:
                # x[n] with a dynamic int n: the fake Tensor.__getitem__ reads int(n) (a
                # guard L['n'] == 2, a recompile per value); x.select(0, n) is the same
                # and keeps n symbolic, as in torch.compile
                import torch

                from .variables.constant import ConstantVariable

                return self.output.create_graph_op("call_function", torch.select,
                                                   [obj, ConstantVariable(0), index], {})
            if getattr(self.output, "getitem_as_index", False):
                # inside a FlexAttention mod: ``table[q_idx]`` with 0-d index tensors is
                # aten.index, not an int read (hops/flex_attention.py)
                from .hops.flex_attention import index_with_tensors

                indexed = index_with_tensors(self, obj, index)
                if indexed is not None:
                    return indexed
            return self.output.create_graph_op("call_function", operator.getitem,
                                               [obj, index], {})
        if hasattr(obj, "getitem"):
            return obj.getitem(self, index)
        if isinstance(obj, NNModuleVariable):
            return obj.getitem(self, index)
        if obj.is_python_constant() and index.is_python_constant():
            from .variables.constant import wrap_constant_result

            try:
                result = obj.as_python_constant()[index.as_python_constant()]
            except Exception as e:  # noqa: BLE001
                from .variables.raising import raise_traced_from

                raise_traced_from(e, "indexing")
            return wrap_constant_result(result, what="indexing")
        raise Unsupported(f"indexing {obj.describe()}")

    def unpack_sequence(self, value: VariableTracker) -> list[VariableTracker]:
        value = self.realize(value)
        if value.has_unpack_var_sequence(self):
            return value.unpack_var_sequence(self)
        raise Unsupported(f"iterating over {value.describe()}")

    def call_function(self, fn: VariableTracker, args: list[VariableTracker],
                      kwargs: dict[str, VariableTracker]) -> VariableTracker:
        fn = self.realize(fn)
        args = [self.realize(a) for a in args]
        kwargs = {k: self.realize(v) for k, v in kwargs.items()}
        result = fn.call_function(self, args, kwargs)
        assert isinstance(result, VariableTracker), (fn, result)
        return result

    def inline_call(self, fn_var: VariableTracker, args: list[VariableTracker],
                    kwargs: dict[str, VariableTracker], *, suspended: bool = False) -> Any:
        """Inline a call of ``fn_var``; ``suspended``: for a generator function, return its
        translator unstarted, to be run one ``yield`` at a time (``resume_generator``)."""
        from .. import config
        from .variables.functions import bind_args

        limit = getattr(config, "inline_depth_limit", MAX_INLINE_DEPTH)
        if self.depth >= limit:
            raise Unsupported(f"inlining deeper than {limit} calls "
                              "(config.inline_depth_limit)")
        code = fn_var.get_code()
        defaults, kwdefaults = fn_var.get_defaults(self)
        bound = bind_args(code, fn_var.get_name(), args, kwargs, defaults, kwdefaults)
        f_globals = fn_var.get_globals()
        f_builtins = f_globals.get("__builtins__", __builtins__)
        if isinstance(f_builtins, types.ModuleType):
            f_builtins = f_builtins.__dict__
        tx = InliningInstructionTranslator(
            code=code, f_globals=f_globals, f_builtins=f_builtins, symbolic_locals=bound,
            closure_cells=fn_var.get_closure_cells(self), output=self.output, parent=self)
        if code.co_flags & inspect.CO_GENERATOR:
            # a generator (a generator expression, a user generator function) runs one
            # ``yield`` at a time, when its consumer asks for the next item, as in eager
            tx.yielded = []
            tx.suspend_on_yield = True
            if suspended:
                return tx
            from .variables.iterators import GeneratorVariable

            gen = GeneratorVariable(tx, fn_var, args, kwargs)
            self.output.generators.append(gen)
            return gen
        elif suspended:
            raise Unsupported(f"{fn_var.get_name()} is not a generator function")
        tx.run()
        return tx.return_value

    # -- variables in cells -----------------------------------------------------------

    def load_deref(self, name: str) -> VariableTracker:
        cell = self.fresh_cells.get(name) or self.closure_cells.get(name)
        if cell is not None:
            return cell.load(self)
        try:
            return self.symbolic_locals[name]
        except KeyError:
            raise Unsupported(f"free variable {name!r} referenced before assignment") from None

    def store_deref(self, name: str, value: VariableTracker) -> None:
        cell = self.fresh_cells.get(name) or self.closure_cells.get(name)
        if cell is not None:
            cell.store(self, value)
        else:
            self.symbolic_locals[name] = value

    def load_closure(self, name: str) -> VariableTracker:
        cell = self.fresh_cells.get(name) or self.closure_cells.get(name)
        if cell is not None:
            return cell
        return LocalCellVariable(self, name)

    # -- hooks the frame kinds override -----------------------------------------------

    def graph_break_on_jump(self, inst, reason: Unsupported) -> None:
        raise reason

    def do_return(self, value: VariableTracker) -> None:
        raise NotImplementedError

    def defer_requires_grad(self, tensor: TensorVariable) -> bool:
        """Whether ``tensor.requires_grad_()`` can run on the graph's output once the
        current instruction is done (``InstructionTranslator.split_for_requires_grad``)."""
        return False


class InliningInstructionTranslator(InstructionTranslatorBase):
    """Runs a called user function inside the caller's graph."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.return_value: VariableTracker | None = None
        #: values yielded so far when inlining a generator (None: not a generator)
        self.yielded: list[VariableTracker] | None = None

    def do_return(self, value: VariableTracker) -> None:
        self.return_value = value
        self.done = True


class RootFreeVarCell(VariableTracker):
    """A free variable of the frame being compiled: its value comes from the frame's closure
    (reloaded with LOAD_DEREF; guarded through the called function's cell, see
    sources.ClosureSource)."""

    def __init__(self, name: str, cell: types.CellType, index: int):
        super().__init__()
        self.name = name
        self.cell = cell
        self.index = index
        self._value: VariableTracker | None = None

    def load(self, tx) -> VariableTracker:
        return load_real_cell(tx, self, ClosureSource(self.name, self.index),
                              f"free variable {self.name!r} referenced before assignment")

    def store(self, tx, value) -> None:
        """``nonlocal`` write to the frame's free variable: replayed after the graph."""
        tx.output.side_effects.store_cell(self.cell, value)

    def reconstruct(self, codegen):
        raise Unsupported("cannot rebuild a closure cell")


class InstructionTranslator(InstructionTranslatorBase):
    """Translates the frame itself; produces the transformed code."""

    def __init__(self, frame_info: Any, *, compiler_fn, nopython: bool,
                 break_points: dict[int, Unsupported] | None = None,
                 dynamic: bool | None = None, frame_state: dict | None = None,
                 use_shape_env: bool = False, refuse_requires_grad_: bool = False,
                 refused: frozenset[str] = frozenset()):
        code = frame_info.code
        f_builtins = frame_info.builtins
        if isinstance(f_builtins, types.ModuleType):
            f_builtins = f_builtins.__dict__
        output = OutputGraph(f_globals=frame_info.globals, compiler_fn=compiler_fn,
                             code_name=code.co_name, dynamic=dynamic,
                             frame_state=frame_state, use_shape_env=use_shape_env)
        output.refuse_requires_grad_ = refuse_requires_grad_
        output.refused = refused
        nslots = num_argument_slots(code)
        arg_names = code.co_varnames[:nslots]
        args = tuple(frame_info.args)
        if len(args) != nslots:
            raise Unsupported(f"frame has {len(args)} argument values for {nslots} slots")
        symbolic_locals: dict[str, VariableTracker] = {
            name: LazyVariable(value, LocalSource(name))
            for name, value in zip(arg_names, args, strict=True)
        }
        closure = frame_info.closure or ()
        closure_cells: dict[str, VariableTracker] = {
            name: RootFreeVarCell(name, cell, i)
            for i, (name, cell) in enumerate(zip(code.co_freevars, closure, strict=False))
        }
        super().__init__(code=code, f_globals=frame_info.globals, f_builtins=f_builtins,
                         symbolic_locals=symbolic_locals, closure_cells=closure_cells,
                         output=output)
        self.frame_info = frame_info
        self.nopython = nopython
        self.arg_names = arg_names
        self.break_points = dict(break_points or {})
        #: the transformed code's instructions, once the frame is done
        self.output_instructions: list | None = None
        #: graph breaks taken: (reason, filename, lineno)
        self.graph_breaks: list[Unsupported] = []
        #: names of resume functions created (installed globals or made in the code)
        self.resume_names: list[str] = []
        #: (tensor, its node's users then) of ``requires_grad_()`` calls deferred to the
        #: end of the current instruction (``split_for_requires_grad``)
        self.pending_requires_grad: list[tuple[TensorVariable, set]] = []

    # -- running ----------------------------------------------------------------------

    def run(self) -> None:
        grad_mode = torch.is_grad_enabled()
        try:
            self._run()
        finally:
            # context managers entered while tracing switched the real grad/autocast
            # mode: undo what is still active (tracing stopped inside the block)
            for ctx in reversed(getattr(self, "active_contexts", [])):
                ctx.undo_real()
            self.active_contexts = []
            # the exit of a block entered before this frame (a continuation's) switched it
            torch._C._set_grad_enabled(grad_mode)

    def _run(self) -> None:
        while not self.done:
            index = self.ip
            if index >= len(self.instructions):
                raise Unsupported("ran past the end of the code (internal error)")
            inst = self.instructions[index]
            reason = self.break_points.get(index)
            if reason is not None:
                if getattr(reason, "kiln_block_start", False) and \
                        self.output.count_calls() == 0:
                    # nothing to compile before the block: the frame runs as is
                    raise reason
                self.ip += 1
                self.current_inst = inst
                self.break_at(inst, index, reason)
                return
            try:
                self.step()
                if self.pending_requires_grad and not self.done:
                    self.split_for_requires_grad(index)
                    return
            except Unsupported as e:
                e.with_location(*self.location(inst))
                if self.nopython:
                    raise
                if isinstance(e, TracedException) or inst.opname == "BEFORE_WITH":
                    # raised here and caught by no traced handler: it leaves the frame,
                    # which then runs as is (as under TorchDynamo: no graph before it);
                    # so does a `with` on a context manager that cannot be entered here
                    raise Unsupported(str(e)) from e
                if not self.can_break_at(inst) and self.reentered_with(inst, index,
                                                                       on_stack=False):
                    # inside a grad-mode `with`: the call runs in Python inside the mode,
                    # graphs before and after it (break_reentering_with)
                    e.kiln_reenter_with = True
                    raise RestartAnalysis(index, e) from e
                if not self.can_break_at(inst):
                    start = self.block_start(index)
                    if start is None:
                        raise
                    # inside `with`/`try`: break before the block instead, so that it
                    # runs whole in Python (its context is entered there, its handlers
                    # are in place)
                    e.kiln_block_start = True
                    raise RestartAnalysis(start, e) from e
                raise RestartAnalysis(index, e) from e

    def block_start(self, index: int) -> int | None:
        """Where to break for an unsupported instruction inside an exception-table range
        (a ``with`` or ``try`` body): the instruction that opens the outermost block
        (``BEFORE_WITH``, the ``NOP`` of ``try:``), if a break can happen there."""
        inst = self.instructions[index]
        start = None
        while inst.exn_tab_entry is not None:
            j = self.index_of[id(inst.exn_tab_entry.start)] - 1
            if j < 0:
                return None
            start = j
            inst = self.instructions[j]
        if start is None or start >= index or self.in_loop(start):
            return None
        opname = self.instructions[start].opname
        if opname in _NEVER_BREAK_AT and opname != "NOP":
            return None
        if opname != "NOP" and not self.can_break_at(self.instructions[start]):
            return None
        return start

    def in_loop(self, index: int) -> bool:
        """True when instruction ``index`` lies on a cycle of the control flow (it can reach
        itself again).  Like TorchDynamo we do not graph-break in loops: each iteration
        would nest one more resume call.  A backward jump alone is no loop: on 3.12 the
        path taken when a ``with`` block's context manager swallows an exception jumps back
        to the code after the block, which no normal path reaches twice."""
        seen: set[int] = set()
        pending = self.successors(index)
        while pending:
            j = pending.pop()
            if j == index:
                return True
            if j not in seen:
                seen.add(j)
                pending.extend(self.successors(j))
        return False

    def successors(self, index: int) -> list[int]:
        """Where control can go after instruction ``index``: the next instruction, a jump's
        target, the handler of the exception-table entry covering it."""
        inst = self.instructions[index]
        out = []
        if not versions.is_terminator(inst) and index + 1 < len(self.instructions):
            out.append(index + 1)
        if versions.is_jump(inst) and inst.target is not None:
            out.append(self.index_of[id(inst.target)])
        if inst.exn_tab_entry is not None:
            out.append(self.index_of[id(inst.exn_tab_entry.target)])
        return out

    def can_break_at(self, inst) -> bool:
        if inst.exn_tab_entry is not None:
            return False
        if "__class__" in self.code.co_freevars:
            # zero-argument super() reads the frame's first local as `self`; a resume
            # function's first argument is a stack value, so the frame runs as is instead
            return False
        if inst.opname in _NEVER_BREAK_AT:
            # a resume function's prologue is made of these: breaking there would make a
            # resume function identical to the current one, forever
            return False
        if self.in_loop(self.index_of[id(inst)]):
            return False
        name = inst.opname
        if name in _CALL_OPNAMES or name in _CALL_PREFIX_OPNAMES:
            return True
        if versions.is_conditional_jump(inst):
            return name not in ("FOR_ITER", "SEND")
        if versions.is_terminator(inst) or versions.is_jump(inst):
            return False
        return True

    # -- codegen helpers --------------------------------------------------------------

    def new_codegen(self) -> PyCodegen:
        return PyCodegen(cellvars=self.code.co_cellvars, freevars=self.code.co_freevars,
                         install_global_object=self.output.install_global_object)

    def prefix_instructions(self) -> list:
        """Fresh copies of the code's prologue (COPY_FREE_VARS, MAKE_CELL..., RESUME)."""
        out = []
        for inst in self.instructions:
            new = create_instruction(inst.opname, arg=inst.arg, argval=inst.argval)
            new.positions = inst.positions
            out.append(new)
            if inst.opname == "RESUME":
                break
        return out

    def plan_graph_outputs(self, cg: PyCodegen,
                           values: list[VariableTracker]) -> list[TensorVariable]:
        """The tensors in ``values`` that cannot be reloaded from a source: the graph must
        return them.  Registers their temporaries in ``cg``."""
        outputs: list[TensorVariable] = []
        seen: set = set()
        from ..shapes import SymNodeVariable

        for v in walk_trackers(values):
            if isinstance(v, (TensorVariable, SymNodeVariable)) and v.source is None \
                    and v.node not in seen:
                seen.add(v.node)
                cg.graph_outputs[v.node] = f"___kiln_graph_out_{len(outputs)}"
                outputs.append(v)
        return outputs

    def graph_call(self, outputs: list[TensorVariable]) -> list:
        """Compile the graph (when it has work) and return the instructions that call it and
        store its outputs.  Called once the rest of the code was generated without error."""
        if self.output.count_calls() == 0 and not outputs:
            return []
        if self.output.leaks_requires_grad(outputs):
            reason = Unsupported("the graph would return a tensor that requires grad through "
                                 "requires_grad_() of an intermediate (a backend's functional "
                                 "trace drops that flag); call .detach() before returning it")
            if self.nopython:
                raise reason
            raise RequiresGradRestart(reason)
        from .variables.tensor_data import check_data_takes
        from .variables.tensor_select import check_unobserved

        check_unobserved(self.output, outputs)
        check_data_takes(self.output, outputs)
        name = self.output.compile_graph(outputs)
        cg = self.new_codegen()
        cg.extend(builders.load_global_native(name))
        inputs = self.output.graph_inputs
        for _node, source, _real in inputs:
            source.reconstruct(cg)
        cg.extend(builders.call_native(len(inputs)))
        if outputs:
            cg.extend(builders.unpack_sequence(len(outputs)))
            for i in range(len(outputs)):
                cg.store_fast(f"___kiln_graph_out_{i}")
        else:
            cg.pop_top()
        return cg.insts

    def store_aliases(self, cg: PyCodegen, values: list[VariableTracker]) -> None:
        """Mutable containers referenced more than once are rebuilt once, into temps."""
        counts: dict[int, int] = {}
        objs: dict[int, VariableTracker] = {}

        def count(v):
            if isinstance(v, LazyVariable) and v.realized is not None:
                v = v.realized
            if v.mutable:
                counts[id(v)] = counts.get(id(v), 0) + 1
                objs[id(v)] = v
                if counts[id(v)] > 1:
                    return
            for it in v.children():
                count(it)

        for v in values:
            count(v)
        k = 0
        for v in walk_trackers(values):
            if counts.get(id(v), 0) > 1:
                cg.store_in_temp(objs[id(v)], f"___kiln_alias_{k}")
                k += 1

    def make_resume_call(self, target_index: int, stack_vars: list[str | None],
                         live: list[str]) -> tuple[list, list]:
        """Instructions that push NULL + the resume function (``head``), and that call it
        with the stack values and ``live`` locals already pushed, then return (``tail``)."""
        target = self.instructions[target_index]
        key = (target.offset, tuple(s if s is None or isinstance(s, str) else
                                    tuple((i.opname, repr(i.argval)) for i in s)
                                    for s in stack_vars),
               tuple(live), id(self.f_globals))
        per_code = _resume_cache.setdefault(self.code, {})
        cached = per_code.get(key)
        if cached is None:
            name = f"__resume_at_{target.offset}_{next(_resume_counter)}"
            try:
                code = make_resume_code(self.code, target, stack_vars, live, name)
            except BytecodeError as e:
                raise Unsupported(f"cannot make a resume function: {e}") from e
            fn = None if code.co_freevars else types.FunctionType(code, self.f_globals, name)
            per_code[key] = cached = (name, code, fn)
        name, code, fn = cached
        self.resume_names.append(name)
        head: list = []
        if fn is None:
            head += builders.push_null()
            head += builders.make_function(code, code.co_freevars)
        else:
            if self.f_globals.get(name) is not fn:
                self.output.install_global(name, fn)
            else:
                self.output.installed_globals[name] = fn
            head += builders.load_global(name, True)
        nargs = len([s for s in stack_vars if isinstance(s, str)]) + len(live)
        tail = builders.call_function(nargs) + builders.return_value()
        return head, tail

    def finish(self, insts: list) -> None:
        self.output_instructions = self.prefix_instructions() + insts
        self.done = True

    def cell_values(self) -> list[VariableTracker]:
        """The values ``store_cells`` writes back (graph outputs when they are tensors)."""
        out = []
        for name in self.code.co_cellvars:
            v = self.symbolic_locals.get(name)
            if v is None or isinstance(v, DeletedVariable) or (
                    isinstance(v, LazyVariable) and v.realized is None):
                continue
            out.append(v)
        return out

    def escaping_cells(self, values: list[VariableTracker]) -> list[str]:
        """The frame's own cells that functions made in the frame and reachable from
        ``values`` (returned, stored by a side effect) close over, and the cells those
        cells' values close over: the transformed code writes them before returning, as
        the locals live only in the trackers (a returned closure read an empty cell)."""
        return self.closure_cells_reached(values)[0]

    def closure_cells_reached(self, values: list[VariableTracker]
                              ) -> tuple[list[str], list[VariableTracker]]:
        """(names of the frame's own cells, values of inlined functions' cells) that the
        functions made while tracing and reachable from ``values`` close over, transitively.
        The values of inlined functions' cells go into the rebuilt cells
        (``NestedUserFunctionVariable.reconstruct``): tensors among them are graph
        outputs."""
        from .variables.functions import NestedUserFunctionVariable

        own = set(self.code.co_cellvars)
        found: list[str] = []
        others: list[VariableTracker] = []
        seen: set[int] = set()
        seen_cells: set[tuple[int, str]] = set()
        frontier = list(values)
        while frontier:
            reached = []
            for fn in walk_trackers(frontier):
                if not isinstance(fn, NestedUserFunctionVariable) or id(fn) in seen:
                    continue
                seen.add(id(fn))
                for cell in fn.closure:
                    name = getattr(cell, "name", None)
                    if not isinstance(cell, LocalCellVariable) or \
                            (id(cell.tx), name) in seen_cells:
                        continue
                    seen_cells.add((id(cell.tx), name))
                    v = cell.tx.symbolic_locals.get(name)
                    if v is None or isinstance(v, DeletedVariable) or (
                            isinstance(v, LazyVariable) and v.realized is None):
                        continue  # unset, or an argument still in its cell
                    if cell.tx is self:
                        if name not in own:
                            continue
                        found.append(name)
                    else:
                        others.append(v)
                    reached.append(v)
            frontier = reached
        return found, others

    def store_cells(self, cg: PyCodegen) -> None:
        """Write the current values of the frame's own cell variables into their cells (the
        resume function shares them through its closure)."""
        for name in self.code.co_cellvars:
            v = self.symbolic_locals.get(name)
            if v is None or isinstance(v, DeletedVariable):
                continue
            if isinstance(v, LazyVariable) and v.realized is None:
                continue  # an argument that is still in its cell
            cg(v)
            cg.store_local(name)

    # -- returning --------------------------------------------------------------------

    def do_return(self, value: VariableTracker) -> None:
        from .variables.iterators import close_dropped_generators

        # the frame's locals die after its return value is built: a generator paused
        # inside try/finally or with that only they held runs its cleanup now, as in eager
        close_dropped_generators(self, [value, *self.output.side_effects.values()],
                                 frame_end=True)
        cg = self.new_codegen()
        side_effects = self.output.side_effects
        values = [value, *side_effects.values()]
        cells, inlined_cell_values = self.closure_cells_reached(values)
        cell_values = [self.symbolic_locals[n] for n in cells] + inlined_cell_values
        outputs = self.plan_graph_outputs(cg, values + cell_values)
        passed_through: list[TensorVariable] = []
        if self.output.count_calls() == 0 and not outputs and self.nopython:
            passed_through = self.returned_input_tensors(values + cell_values)
        if self.output.count_calls() == 0 and not outputs and not passed_through:
            # nothing worth compiling (mutations then happen by running the frame as is)
            self.output_instructions = None
            self.done = True
            return
        self.store_aliases(cg, values + cell_values)
        for name in cells:
            cg(self.symbolic_locals[name])
            cg.store_local(name)
        cg(value)
        side_effects.codegen(cg)  # after the return value is built, before returning
        cg.return_value()
        self.finish(self.graph_call(outputs or passed_through) + cg.insts)

    def returned_input_tensors(self, values: list[VariableTracker]) -> list[TensorVariable]:
        """The frame's input tensors among ``values``. Under fullgraph a frame with no op
        that returns (or stores) a tensor still gives the backend a graph passing those
        tensors through, as torch.compile does; the frame itself goes on reloading them from
        their sources (the graph's outputs are dropped: same objects as eager)."""
        found: list[TensorVariable] = []
        for v in walk_trackers(values):
            if isinstance(v, LazyVariable) and v.realized is None:
                if type(v.value) is not torch.Tensor and \
                        type(v.value) is not torch.nn.Parameter:
                    continue
                v = self.realize(v)
            if isinstance(v, TensorVariable) and v.source is not None and \
                    all(v.node is not f.node for f in found):
                found.append(v)
        return found

    # -- graph breaks -----------------------------------------------------------------

    def graph_break_on_jump(self, inst, reason: Unsupported) -> None:
        reason.with_location(*self.location(inst))
        if self.nopython or not self.can_break_at(inst):
            raise reason
        # the condition is still on the stack: put it back for break_at
        raise RestartAnalysis(self.index_of[id(inst)], reason)

    def stack_var(self, i: int) -> str:
        """Name of the resume function's argument for stack slot ``i`` (not a name the code
        already uses: resume functions of resume functions)."""
        base = "___stack"
        while any(v.startswith(base) for v in self.code.co_varnames):
            base += "_"
        return f"{base}{i}"

    def break_at(self, inst, index: int, reason: Unsupported) -> None:
        from .variables.iterators import pending_cleanup

        if any(pending_cleanup(g) for g in self.output.generators):
            # neither rebuilt for the resume function nor dropped: its finally must run.
            # (A rebuilt one cannot be closed when eager closes it: the frame that calls
            # the resume function holds it on its stack until that returns, and the resume
            # function's own transformed code keeps it in its argument slot after a `del`.)
            raise Unsupported("graph break while a generator is paused inside try/finally "
                              "or with") from reason
        self.graph_breaks.append(reason)
        if getattr(reason, "kiln_reenter_with", False):
            return self.break_reentering_with(inst, index, self.call_prefix + [inst])
        if versions.is_conditional_jump(inst):
            return self.break_at_jump(inst, index)
        if inst.opname in _CALL_OPNAMES:
            return self.break_at_instruction(inst, index, self.call_prefix + [inst])
        if inst.opname in _CALL_PREFIX_OPNAMES:
            raise Unsupported(f"cannot break at {inst.opname}") from reason
        return self.break_at_instruction(inst, index, [inst])

    def defer_requires_grad(self, tensor: TensorVariable) -> bool:
        """``requires_grad_()`` of an intermediate that would leave the graph: rather than
        breaking at the call (a call of an inlined function breaks at the frame's call of
        it), end the graph after the frame's current instruction, set the flag on the
        graph's output in Python and go on in a resume function, which takes the tensor as
        the leaf it now is (torch.compile makes a graph fewer: it breaks at the call). Only
        where a break can happen there (no try/with around it, no loop), and only while
        nothing in the graph has used the tensor since (checked at the split)."""
        index = self.ip
        if self.nopython or index >= len(self.instructions):
            return False
        inst = self.instructions[index]
        if inst.exn_tab_entry is not None or self.in_loop(index) or \
                "__class__" in self.code.co_freevars:
            return False
        from .variables.iterators import pending_cleanup

        if any(pending_cleanup(g) for g in self.output.generators):
            return False
        fake = tensor.example_value
        if not fake.is_leaf:  # pragma: no cover - a tensor not requiring grad is a leaf
            return False
        with self.output.fake_mode:
            fake.requires_grad_()  # what reads of it give until the split
        self.pending_requires_grad.append((tensor, set(tensor.node.users)))
        return True

    def split_for_requires_grad(self, index: int) -> None:
        """End the graph before instruction ``ip``: ``requires_grad_()`` of the deferred
        tensors on the graph's outputs, then the resume function at ``ip`` with the stack
        and the live locals."""
        target = self.ip
        inst = self.instructions[target] if target < len(self.instructions) else None
        if inst is None or inst.exn_tab_entry is not None or self.in_loop(target):
            raise Unsupported("requires_grad_() of an intermediate where the graph cannot "
                              "end after the instruction")
        for tensor, users in self.pending_requires_grad:
            if set(tensor.node.users) != users:
                raise Unsupported("requires_grad_() of an intermediate that the graph then "
                                  "uses (its gradient would leave the graph)")
        for tensor, _users in self.pending_requires_grad:
            with self.output.fake_mode:
                tensor.example_value.requires_grad_(False)  # as the graph computes it
        reason = Unsupported("requires_grad_() of an intermediate: the graph ends after "
                             "the instruction, the flag is set on its output")
        reason.with_location(*self.location(self.instructions[index]))
        self.graph_breaks.append(reason)
        stack = list(self.stack)
        live = self.live_locals(target)
        cg, outputs, stack_loads, local_loads = self.stash_break_state(stack, live)
        for tensor, _users in self.pending_requires_grad:
            if tensor.node in cg.graph_outputs:  # (else nothing after the graph reads it)
                cg.push_null()
                cg.load_const_object(torch.Tensor.requires_grad_)
                cg(tensor)
                cg.call_function(1)
                cg.pop_top()
        stack_vars = [None if isinstance(v, NullVariable) else self.stack_var(i)
                      for i, v in enumerate(stack)]
        head, tail = self.make_resume_call(target, stack_vars, live)
        cg.extend(head)
        for v, load in zip(stack, stack_loads, strict=True):
            if not isinstance(v, NullVariable):
                load(cg)
        for load in local_loads.values():
            load(cg)
        cg.extend(tail)
        self.finish(self.graph_call(outputs) + cg.insts)

    def _pops(self, inst) -> int | None:
        if inst.opname == "CALL":
            return inst.arg + 2
        if inst.opname == "CALL_KW":  # 3.13: the keyword names are on the stack too
            return inst.arg + 3
        if inst.opname == "CALL_FUNCTION_EX":
            return 3 + (inst.arg & 1)
        return None

    def stash(self, cg: PyCodegen, var: VariableTracker, temp: str):
        """Make ``var`` loadable after the graph call: values whose reload is pure and
        cannot change (constants, the frame's own argument slots, graph outputs) are
        rebuilt where used; anything else is rebuilt now into local ``temp``.  Returns a
        function that emits the load."""
        if isinstance(var, LazyVariable) and var.realized is not None:
            var = var.realized
        if isinstance(var, NullVariable):
            return lambda c: c.push_null()
        if id(var) in cg.temps:
            t = cg.temps[id(var)]
            return lambda c: c.load_fast(t)
        cheap = False
        cells = set(self.code.co_cellvars) | set(self.code.co_freevars)
        if isinstance(var, TensorVariable) and var.source is None:
            cheap = True
        elif isinstance(var.source, LocalSource) and var.source.local_name not in cells:
            cheap = True  # argument slots are never written by the transformed code
        elif isinstance(var, ConstantVariable) and not isinstance(var.value, (slice, range)):
            cheap = type(var.value) in (int, float, bool, str, bytes, complex, type(None))
        if cheap:
            return lambda c: c(var)
        cg.store_in_temp(var, temp)
        return lambda c: c.load_fast(temp)

    def sub_codegen(self, cg: PyCodegen) -> PyCodegen:
        sub = self.new_codegen()
        sub.graph_outputs = cg.graph_outputs
        sub.temps = cg.temps
        # cells rebuilt for closures of inlined functions: one object each (functions.py)
        sub.rebuilt_cells = cg.__dict__.setdefault("rebuilt_cells", {})
        return sub

    def stash_break_state(self, stack: list, live: list[str],
                          keep: Callable[[int, VariableTracker], bool] = lambda i, v: True):
        """What every graph break emits before leaving the graph for Python (at a call,
        re-entering a ``with``, at a data-dependent jump): the graph's outputs planned,
        aliases stored, the stack items ``keep`` accepts (None for the others) and the
        ``live`` locals stashed in temps, cells and side effects written back.  Returns
        ``(cg, outputs, stack_loads, local_loads)`` (``local_loads``: by name)."""
        local_values = [self.symbolic_locals[n] for n in live]
        cg = self.new_codegen()
        effects = self.output.side_effects.values() + self.cell_values()
        effects += self.closure_cells_reached(stack + local_values + effects)[1]
        outputs = self.plan_graph_outputs(cg, stack + local_values + effects)
        self.store_aliases(cg, stack + local_values + effects)
        stack_loads = [self.stash(cg, v, f"___kiln_stack_{i}") if keep(i, v) else None
                       for i, v in enumerate(stack)]
        local_loads = {n: self.stash(cg, self.symbolic_locals[n], f"___kiln_local_{n}")
                       for n in live}
        self.store_cells(cg)
        self.output.side_effects.codegen(cg)  # Python must see the mutations already
        return cg, outputs, stack_loads, local_loads

    def break_at_instruction(self, inst, index: int, group: list) -> None:
        """Run ``group`` (the unsupported instruction, with its KW_NAMES/PRECALL) in
        Python between the compiled graph and the resume function."""
        stack = list(self.stack)
        pops = self._pops(inst)
        effect = sum(versions.stack_effect(i, jump=False) for i in group)
        if pops is None:
            if any(isinstance(v, NullVariable) for v in stack):
                raise Unsupported(f"cannot break at {inst.opname} with NULL on the stack")
            pops = len(stack)  # push everything; results follow
        below = stack[:len(stack) - pops]
        n_after = len(stack) + effect
        n_results = n_after - len(below)
        if n_results < 0:
            raise Unsupported(f"cannot break at {inst.opname} (stack layout)")
        live = self.live_locals(index + 1)
        cg, outputs, stack_loads, local_loads = self.stash_break_state(stack, live)
        stack_vars: list[str | None] = [
            None if isinstance(v, NullVariable) else self.stack_var(i)
            for i, v in enumerate(below)
        ] + [self.stack_var(len(below) + j) for j in range(n_results)]
        head, tail = self.make_resume_call(index + 1, stack_vars, live)
        cg.extend(head)
        for i, load in enumerate(stack_loads):
            if i < len(below) and isinstance(stack[i], NullVariable):
                continue  # a NULL below the call: the resume function pushes it itself
            load(cg)
        for g in group:
            new = create_instruction(g.opname, arg=g.arg, argval=g.argval)
            new.positions = g.positions
            cg.append(new)
        for load in local_loads.values():
            load(cg)
        cg.extend(tail)
        self.finish(self.graph_call(outputs) + cg.insts)

    def reentered_with(self, inst, index: int, *, on_stack: bool = True):
        """The ``(stack slot, __exit__ tracker)`` of each grad-mode ``with`` block around
        the call ``inst``, outermost first, when a graph break there can leave the blocks
        open in Python (``break_reentering_with``), else None: the call sits in ``with``
        blocks only (each handler starts ``PUSH_EXC_INFO; WITH_EXCEPT_START``; nested blocks
        chain through their cleanup's handler), outside loops, each on
        ``torch.no_grad``/``enable_grad``/``set_grad_enabled`` or ``torch.autocast``, and
        no NULL lies on the stack below the call. ``on_stack=False``: only what the code
        says (True, not trackers), for when the call failed and popped its operands."""
        entry = inst.exn_tab_entry
        if inst.opname not in _CALL_OPNAMES or entry is None or self.nopython:
            return None
        if "__class__" in self.code.co_freevars or self.in_loop(index):
            return None
        if any(p.exn_tab_entry is not entry for p in self.call_prefix):
            return None
        depths: list[int] = []  # innermost first
        block = entry
        while block is not None:
            handler = self.index_of[id(block.target)]
            if self.instructions[handler].opname != "PUSH_EXC_INFO" or \
                    handler + 1 >= len(self.instructions) or \
                    self.instructions[handler + 1].opname != "WITH_EXCEPT_START":
                return None  # a try block, not a with block
            cleanup = self.instructions[handler].exn_tab_entry
            if cleanup is None:
                return None
            depths.append(block.depth)
            block = cleanup.target.exn_tab_entry  # the enclosing block's entry, if any
        if not on_stack:
            return True
        pops = self._pops(inst)
        if pops is None or any(not 0 < d <= len(self.stack) - pops for d in depths):
            return None
        if any(isinstance(v, NullVariable) for v in self.stack[:len(self.stack) - pops]):
            return None
        exits = []
        for depth in reversed(depths):
            exit_var = self.realize(self.stack[depth - 1])
            if not _reenterable(exit_var):
                return None
            exits.append((depth - 1, exit_var))
        return exits

    def break_reentering_with(self, inst, index: int, group: list) -> None:
        """A graph break at a call inside grad-mode ``with`` blocks, as torch.compile takes
        it: the graph so far ends with the mode before the outermost block; in Python a
        ``torch.set_grad_enabled`` (or ``torch.autocast``) object enters each block's mode,
        outermost first, and its ``__exit__`` takes the stack slot of the block's; a
        re-entry function (``make_reentry_code``) runs the call under the innermost block's
        exception-table entry (an exception leaves through those ``__exit__``, as in eager),
        leaves the blocks and calls the continuation, which enters them anew in its prologue
        and is captured as any resume function."""
        from .variables.ctx_managers import enter_for_reentry

        exits = self.reentered_with(inst, index)
        if exits is None:  # not grad-mode blocks after all: break before the block
            start = self.block_start(index)
            reason = Unsupported(str(self.graph_breaks.pop()))
            if start is None:
                raise reason
            reason.kiln_block_start = True
            raise RestartAnalysis(start, reason)
        slots = {slot: exit_var.ctx for slot, exit_var in exits}
        stack = list(self.stack)
        pops = self._pops(inst)
        effect = sum(versions.stack_effect(i, jump=False) for i in group)
        n_after = len(stack) + effect
        if n_after < len(stack) - pops:
            raise Unsupported(f"cannot break at {inst.opname} (stack layout)")
        for _slot, exit_var in reversed(exits):
            exit_var.ctx.exit(self)  # the graph leaves the modes as it found them
        live = self.live_locals(index + 1)
        cg, outputs, stack_loads, local_loads = self.stash_break_state(
            stack, live, keep=lambda i, v: i not in slots and not isinstance(v, NullVariable))
        stack_vars = [None if isinstance(v, NullVariable) else self.stack_var(i)
                      for i, v in enumerate(stack)]
        # the re-entry function leaves the blocks after the call; the continuation enters
        # new ones in its prologue, traced as any `with` (enter and exit nodes in its graph,
        # as torch.compile's re-entered block: a graph never ends in another mode than it
        # began with, which backends that fold mode switches at trace time rely on)
        after_vars: list = [self.stack_var(i) for i in range(n_after)]
        for slot, ctx in slots.items():
            after_vars[slot] = self._rebuild_mode(ctx) + [create_instruction("BEFORE_WITH")] \
                + builders.pop_top()
        continuation, _ = self.make_resume_call(index + 1, after_vars, live)
        name = f"__kiln_reenter_at_{inst.offset}_{next(_resume_counter)}"
        try:
            code = make_reentry_code(self.code, group[0], inst.offset, stack_vars, live,
                                     n_after, continuation, name,
                                     close_slots=sorted(slots, reverse=True))
        except BytecodeError as e:
            raise Unsupported(f"cannot make a re-entry function: {e}") from e
        if code.co_freevars:
            cg.extend(builders.push_null() + builders.make_function(code, code.co_freevars))
        else:
            self.output.install_global(name, types.FunctionType(code, self.f_globals, name))
            cg.extend(builders.load_global(name, True))
        self.resume_names.append(name)
        for i, load in enumerate(stack_loads):
            ctx = slots.get(i)
            if ctx is not None and _is_autocast(ctx):  # a new autocast, entered now
                cg.push_null()
                cg.load_const_object(enter_for_reentry)
                cg(ctx)
                cg.call_function(1)
            elif ctx is not None:  # the block's mode, entered now, and its exit
                cg.push_null()
                cg.load_const_object(torch.set_grad_enabled)
                cg.load_const(ctx.target)
                cg.call_function(1)
                cg.load_attr("__exit__")
            elif load is not None:
                load(cg)
        for load in local_loads.values():
            load(cg)
        cg.extend(builders.call_function(len([v for v in stack_vars if v is not None])
                                         + len(live)) + builders.return_value())
        self.finish(self.graph_call(outputs) + cg.insts)

    def _rebuild_mode(self, ctx) -> list:
        """Instructions that push a fresh context manager of ``ctx``'s mode (a
        continuation's prologue enters it)."""
        if _is_autocast(ctx):
            cls_name = self.output.install_global_object("autocast", torch.autocast)
            rebuild = builders.load_global(cls_name, True)
            for v in (ctx.device_type, ctx.dtype, ctx.enabled, ctx.cache_enabled):
                rebuild += builders.load_const(v)
            return rebuild + builders.call_function(4)
        mode_cls = torch.enable_grad if ctx.target else torch.no_grad
        cls_name = self.output.install_global_object("grad_mode", mode_cls)
        return builders.load_global(cls_name, True) + builders.call_function(0)

    def break_at_jump(self, inst, index: int) -> None:
        name = inst.opname
        if "IF_TRUE" in name:
            sense = "true"
        elif "IF_FALSE" in name:
            sense = "false"
        elif "IF_NOT_NONE" in name:
            sense = "not_none"
        elif "IF_NONE" in name:
            sense = "none"
        else:
            raise Unsupported(f"cannot break at {name}")
        or_pop = name.endswith("_OR_POP")
        stack = list(self.stack)
        cond, rest = stack[-1], stack[:-1]
        jump_index = self.index_of[id(inst.target)]
        fall_index = index + 1
        live_fall = self.live_locals(fall_index)
        live_jump = self.live_locals(jump_index)
        names = [n for n in self.code.co_varnames if n in live_fall or n in live_jump]
        cg, outputs, stack_loads, local_loads = self.stash_break_state(
            stack, names, keep=lambda i, v: i < len(rest))  # not the condition: cg(cond) below
        rest_loads = stack_loads[:len(rest)]
        cg(cond)
        if or_pop:
            cg.extend(builders.copy(1))
            cg.store_fast("___kiln_cond")
        rest_vars = [None if isinstance(v, NullVariable) else self.stack_var(i)
                     for i, v in enumerate(rest)]

        def branch(target_index: int, live: list[str], with_cond: bool) -> list:
            svars = list(rest_vars) + ([self.stack_var(len(rest))] if with_cond else [])
            head, tail = self.make_resume_call(target_index, svars, live)
            sub = self.sub_codegen(cg)
            sub.extend(head)
            for v, load in zip(rest, rest_loads, strict=True):
                if not isinstance(v, NullVariable):
                    load(sub)
            if with_cond:
                sub.load_fast("___kiln_cond")
            for n in live:
                local_loads[n](sub)
            sub.extend(tail)
            return sub.insts

        fall = branch(fall_index, live_fall, False)
        jump = branch(jump_index, live_jump, or_pop)
        cg.extend(builders.pop_jump_if(sense, jump[0]))
        cg.extend(fall)
        cg.extend(jump)
        self.finish(self.graph_call(outputs) + cg.insts)


def _is_autocast(ctx) -> bool:
    from .variables.ctx_managers import AutocastVariable

    return isinstance(ctx, AutocastVariable)


def _reenterable(exit_var: VariableTracker) -> bool:
    """An ``__exit__`` of a block a graph break can leave and re-enter: a grad mode whose
    previous mode is known, or a traced ``torch.autocast``."""
    from .variables.ctx_managers import (
        AutocastVariable,
        ContextExitVariable,
        GradModeVariable,
    )

    if not isinstance(exit_var, ContextExitVariable):
        return False
    ctx = exit_var.ctx
    if isinstance(ctx, GradModeVariable):
        return isinstance(ctx.prev, bool)
    return type(ctx) is AutocastVariable and ctx.node is not None and \
        ctx.cls is torch.autocast


__all__ = [
    "InstructionTranslatorBase",
    "InstructionTranslator",
    "InliningInstructionTranslator",
    "RefusalRestart",
    "RequiresGradRestart",
    "RestartAnalysis",
    "num_argument_slots",
]
