"""SymPy helpers: size symbols, index functions, simplification, strides, guards.

Symbols (all ``integer=True``; loop and size symbols are also ``nonnegative``/``positive``):
  ``i0, i1, ...`` pointwise loop vars, ``r0, r1, ...`` reduction loop vars, ``s0, s1, ...``
  dynamic sizes of the graph's inputs, ``ind0, ...`` indirect indices (``ops.indirect_indexing``).

Index functions (integer arguments, non-negative by construction):
  ``FloorDiv(a, b)``           = a // b
  ``ModularIndexing(x, d, m)`` = (x // d) % m
Both fold constants and simplify ``FloorDiv(a*d + b, d) -> a + FloorDiv(b, d)`` on creation;
``simplify_index(expr, var_ranges)`` also uses the loop ranges (``ModularIndexing(i1, 1, s1) ->
i1`` when ``0 <= i1 < s1``) and recombines ``d*FloorDiv(x, d) + ModularIndexing(x, 1, d) -> x``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

import sympy
import torch
from sympy.printing.str import StrPrinter

__all__ = [
    "Expr",
    "FloorDiv",
    "ModularIndexing",
    "index_symbol",
    "reduction_symbol",
    "size_symbol",
    "indirect_symbol",
    "symbol_kind",
    "sympify",
    "contiguous_strides",
    "simplify_index",
    "upper_bound",
    "statically_known_lt",
    "statically_known_equal",
    "free_size_symbols",
    "pexpr",
    "sexpr",
    "SizeVarAllocator",
    "SizeVarSource",
    "eval_index",
    "IndexEvaluator",
]

Expr = sympy.Expr


@functools.lru_cache(None)
def named_symbol(name: str) -> sympy.Symbol:
    """A symbol with kiln's assumptions for its prefix (i/r/ind: nonnegative, s: positive)."""
    if name.startswith("s"):
        return sympy.Symbol(name, integer=True, positive=True)
    return sympy.Symbol(name, integer=True, nonnegative=True)


def index_symbol(k: int) -> sympy.Symbol:
    return named_symbol(f"i{k}")


def reduction_symbol(k: int) -> sympy.Symbol:
    return named_symbol(f"r{k}")


def size_symbol(k: int) -> sympy.Symbol:
    return named_symbol(f"s{k}")


def indirect_symbol(k: int) -> sympy.Symbol:
    return named_symbol(f"ind{k}")


def symbol_kind(sym: sympy.Symbol) -> str:
    """'i' | 'r' | 's' | 'ind' | '?'"""
    n = sym.name
    if n.startswith("ind"):
        return "ind"
    if n[:1] in ("i", "r", "s") and n[1:].isdigit():
        return n[0]
    return "?"


def sympify(x) -> sympy.Expr:
    if isinstance(x, sympy.Basic):
        return x
    if isinstance(x, bool):
        return sympy.Integer(int(x))
    if isinstance(x, int):
        return sympy.Integer(x)
    # torch.SymInt etc. are handled by the lowering (SizeVarAllocator.to_expr)
    return sympy.sympify(x)


def _is_int(x) -> bool:
    return isinstance(x, sympy.Integer)


class FloorDiv(sympy.Function):
    """Integer floor division ``base // divisor`` (both integer, divisor > 0)."""

    nargs = (2,)
    is_integer = True
    precedence = 50

    def _sympystr(self, printer):
        b, d = self.args
        return f"({printer.parenthesize(b, 50)}//{printer.parenthesize(d, 50)})"

    @property
    def is_nonnegative(self):
        return self.args[0].is_nonnegative

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 0:
            # divisors are extents of index spaces: a zero one means a zero-size tensor, whose
            # loops never run, so the value is never used (0 keeps the expression printable)
            return sympy.Integer(0)
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if _is_int(base) and _is_int(divisor):
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        # FloorDiv(a*d + b, d) -> a + FloorDiv(b, d)   (exact for integers)
        if isinstance(base, sympy.Add):
            quot, rest = [], []
            for t in base.args:
                q = _exact_div(t, divisor)
                if q is None:
                    rest.append(t)
                else:
                    quot.append(q)
            if quot:
                return sympy.Add(*quot) + FloorDiv(sympy.Add(*rest), divisor)
        q = _exact_div(base, divisor)
        if q is not None:
            return q
        # common integer factor: FloorDiv(6*x, 4) -> FloorDiv(3*x, 2)
        if _is_int(divisor):
            g = sympy.gcd(_int_content(base), int(divisor))
            if g > 1:
                return FloorDiv(sympy.expand(base / g), sympy.Integer(int(divisor) // g))
        return None


class ModularIndexing(sympy.Function):
    """``(base // divisor) % modulus`` for non-negative base, positive divisor and modulus."""

    nargs = (3,)
    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor, modulus):
        if modulus == 1 or base == 0 or modulus == 0 or divisor == 0:
            return sympy.Integer(0)  # zero extents: see FloorDiv.eval
        if _is_int(base) and _is_int(divisor) and _is_int(modulus):
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        if divisor != 1:
            # drop terms that are multiples of divisor*modulus, pull exact multiples of divisor
            pass
        if isinstance(base, sympy.Add):
            keep = []
            changed = False
            for t in base.args:
                if _exact_div(t, divisor * modulus) is not None:
                    changed = True
                    continue
                keep.append(t)
            if changed:
                return ModularIndexing(sympy.Add(*keep), divisor, modulus)
        elif _exact_div(base, divisor * modulus) is not None:
            return sympy.Integer(0)
        if isinstance(base, FloorDiv):
            return ModularIndexing(base.args[0], base.args[1] * divisor, modulus)
        return None


def _int_content(e: sympy.Expr) -> int:
    if _is_int(e):
        return abs(int(e))
    if isinstance(e, sympy.Mul):
        c, _ = e.as_coeff_Mul()
        return abs(int(c)) if _is_int(c) else 1
    if isinstance(e, sympy.Add):
        g = 0
        for t in e.args:
            g = sympy.gcd(g, _int_content(t))
        return int(g) if g else 1
    return 1


def _exact_div(term: sympy.Expr, divisor: sympy.Expr):
    """``term / divisor`` if it is syntactically an integer multiple (a polynomial term), else None."""
    if divisor == 1:
        return term
    if term == 0:
        return sympy.Integer(0)
    q = sympy.cancel(term / divisor) if not _is_int(divisor) else term / divisor
    if isinstance(q, sympy.Rational) and not _is_int(q):
        return None
    if q.is_integer is not True:
        # q must be a product of integer things without denominators
        n, d = sympy.fraction(sympy.together(q))
        if d != 1 and d != -1:
            return None
        q = n * d
    n, d = sympy.fraction(q)
    if d != 1:
        return None
    return q


def sexpr(e) -> str:
    """Readable text of an index expression: terms in stored order (``i1 + i0*s1``)."""
    return _IRPrinter().doprint(sympify(e))


class _IRPrinter(StrPrinter):
    def __init__(self):
        super().__init__({"order": "none"})

    def _print_ModularIndexing(self, e):
        x, d, m = e.args
        return f"ModularIndexing({self._print(x)}, {self._print(d)}, {self._print(m)})"

    def _print_FloorDiv(self, e):
        return f"FloorDiv({self._print(e.args[0])}, {self._print(e.args[1])})"


class _PythonPrinter(StrPrinter):
    """Python source for integer expressions: ``//``, ``%``, ``min``/``max``."""

    def __init__(self):
        super().__init__({"order": "none"})

    def _print_FloorDiv(self, e):
        return f"({self._print(e.args[0])} // {self._print(e.args[1])})"

    def _print_ModularIndexing(self, e):
        x, d, m = (self._print(a) for a in e.args)
        if e.args[1] == 1:
            return f"({x} % {m})"
        return f"(({x} // {d}) % {m})"

    def _print_Min(self, e):
        return "min(" + ", ".join(self._print(a) for a in e.args) + ")"

    def _print_Max(self, e):
        return "max(" + ", ".join(self._print(a) for a in e.args) + ")"

    def _print_Pow(self, e, rational=False):
        b, p = e.args
        if _is_int(p) and int(p) > 0:
            return "(" + "*".join([self.parenthesize(b, 50)] * int(p)) + ")"
        return super()._print_Pow(e, rational)

    def _print_Rational(self, e):
        return f"({e.p}/{e.q})"


def pexpr(e) -> str:
    """Python source text of an integer expression (sizes for the wrapper: ``s0*s1``)."""
    return _PythonPrinter().doprint(sympify(e))


def contiguous_strides(size: Sequence) -> tuple[sympy.Expr, ...]:
    strides = []
    acc = sympy.Integer(1)
    for s in reversed(list(size)):
        strides.append(acc)
        acc = acc * sympify(s)
    return tuple(reversed(strides))


def free_size_symbols(exprs: Iterable) -> list[sympy.Symbol]:
    """The ``s*`` symbols used in ``exprs``, sorted by number."""
    out = set()
    for e in exprs:
        e = sympify(e)
        for s in e.free_symbols:
            if symbol_kind(s) == "s":
                out.add(s)
    return sorted(out, key=lambda s: int(s.name[1:]))


# --------------------------------------------------------------------------------------------
# bounds and simplification with loop ranges
# --------------------------------------------------------------------------------------------


def upper_bound(expr: sympy.Expr, var_ranges: dict) -> sympy.Expr | None:
    """An upper bound of a non-negative index expression given ``{var: range}`` (var < range);
    None if unknown."""
    expr = sympify(expr)
    if expr.is_Integer:
        return expr
    if expr.is_Symbol:
        if expr in var_ranges:
            return sympify(var_ranges[expr]) - 1
        if symbol_kind(expr) == "s":
            return expr
        return None
    if isinstance(expr, sympy.Add):
        parts = [upper_bound(a, var_ranges) for a in expr.args]
        if any(p is None for p in parts):
            return None
        return sympy.Add(*parts)
    if isinstance(expr, sympy.Mul):
        c, rest = expr.as_coeff_Mul()
        if c.is_negative:
            return None
        parts = [upper_bound(a, var_ranges) for a in sympy.Mul.make_args(rest)]
        if any(p is None for p in parts):
            return None
        return c * sympy.Mul(*parts)
    if isinstance(expr, ModularIndexing):
        return expr.args[2] - 1
    if isinstance(expr, FloorDiv):
        ub = upper_bound(expr.args[0], var_ranges)
        if ub is None:
            return None
        return FloorDiv(ub, expr.args[1])
    if isinstance(expr, sympy.Min):
        parts = [upper_bound(a, var_ranges) for a in expr.args]
        parts = [p for p in parts if p is not None]
        return sympy.Min(*parts) if parts else None
    if isinstance(expr, sympy.Max):
        parts = [upper_bound(a, var_ranges) for a in expr.args]
        if any(p is None for p in parts):
            return None
        return sympy.Max(*parts)
    return None


def statically_known_lt(a, b) -> bool:
    """True when ``a < b`` for every positive value of the size symbols (by SymPy)."""
    d = sympy.simplify(sympify(b) - sympify(a))
    if d.is_positive:
        return True
    if d.is_Integer:
        return int(d) > 0
    return False


def statically_known_equal(a, b) -> bool:
    a, b = sympify(a), sympify(b)
    if a == b:
        return True
    return sympy.simplify(a - b) == 0


def _combine_floor_mod(expr: sympy.Expr) -> sympy.Expr:
    """``c*d*FloorDiv(x, d*m) + c*ModularIndexing(x, d... )`` recombination, to a fixed point.

    Pattern: ``c*div*ModularIndexing(x, div, mod) + c*div*mod*FloorDiv(x, div*mod)`` ->
    ``c*div*FloorDiv(x, div)`` (``FloorDiv(x, 1) = x``)."""
    if not isinstance(expr, sympy.Add):
        return expr
    changed = True
    terms = list(expr.args)
    while changed:
        changed = False
        # decompose each term as coeff * atom
        dec = []
        for t in terms:
            c, atom = _split_atom(t)
            dec.append((c, atom))
        for a_idx, (ca, atom_a) in enumerate(dec):
            if not isinstance(atom_a, ModularIndexing):
                continue
            x, div, mod = atom_a.args
            # ca must be (c * div)
            c = sympy.cancel(ca / div)
            for b_idx, (cb, atom_b) in enumerate(dec):
                if b_idx == a_idx:
                    continue
                if isinstance(atom_b, FloorDiv):
                    xb, db = atom_b.args
                elif atom_b == x and div * mod == 1:
                    xb, db = x, sympy.Integer(1)
                else:
                    continue
                if xb != x:
                    continue
                if sympy.simplify(db - div * mod) != 0:
                    continue
                if sympy.simplify(cb - c * div * mod) != 0:
                    continue
                new = c * div * FloorDiv(x, div)
                terms = [t for k, t in enumerate(terms) if k not in (a_idx, b_idx)] + [new]
                changed = True
                break
            if changed:
                break
    return sympy.Add(*terms)


def _split_atom(t: sympy.Expr):
    if isinstance(t, sympy.Mul):
        atoms = [a for a in t.args if isinstance(a, (FloorDiv, ModularIndexing))]
        if len(atoms) == 1:
            atom = atoms[0]
            return sympy.Mul(*[a for a in t.args if a is not atom]), atom
    return sympy.Integer(1), t


def simplify_index(expr, var_ranges: dict | None = None) -> sympy.Expr:
    """Simplify an index expression, using ``var_ranges`` ({symbol: size}) when given.

    Memoized: a model's repeated blocks (GPT-2's 12 layers) ask the same questions, and
    expanding and visiting an index with SymPy costs far more than a lookup."""
    expr = sympify(expr)
    if expr.is_Integer or expr.is_Symbol:
        return expr
    return _simplify_index(expr, frozenset((var_ranges or {}).items()))


@functools.lru_cache(maxsize=16384)
def _simplify_index(expr: sympy.Expr, var_ranges_items: frozenset) -> sympy.Expr:
    var_ranges = dict(var_ranges_items)
    expr = sympy.expand(expr)

    def visit(e):
        if not e.args:
            return e
        args = [visit(a) for a in e.args]
        if isinstance(e, ModularIndexing):
            x, d, m = args
            ub = upper_bound(x, var_ranges)
            if ub is not None:
                if d == 1 and statically_known_lt(ub, m):
                    return x
                if statically_known_lt(ub, d):
                    return sympy.Integer(0)
                if statically_known_lt(ub, d * m):
                    return FloorDiv(x, d)
            return ModularIndexing(x, d, m)
        if isinstance(e, FloorDiv):
            x, d = args
            ub = upper_bound(x, var_ranges)
            if ub is not None and statically_known_lt(ub, d):
                return sympy.Integer(0)
            return FloorDiv(x, d)
        new = e.func(*args) if args != list(e.args) else e
        if isinstance(new, sympy.Add):
            new = _combine_floor_mod(sympy.expand(new))
        return new

    prev = None
    for _ in range(4):
        if expr == prev:
            break
        prev = expr
        expr = visit(expr)
    # drop loop vars whose range is 1
    ones = {v: 0 for v, r in var_ranges.items() if sympify(r) == 1}
    if ones:
        expr = expr.subs(ones)
    return expr


# --------------------------------------------------------------------------------------------
# torch SymInt -> s-symbols
# --------------------------------------------------------------------------------------------


class SizeVarSource:
    """How the wrapper reads a size symbol at run time.

    ``input`` (position of a graph input) with ``dim`` (int: ``inputs[input].size(dim)``;
    ``None``: the input is itself an integer (a SymInt placeholder)); or ``buffer`` (a buffer
    name; an extern kernel's output with data-dependent size) with ``dim``.
    """

    __slots__ = ("input", "dim", "buffer", "stride")

    def __init__(self, input: int | None = None, dim: int | None = None, buffer: str | None = None,
                 stride: bool = False):
        self.input = input
        self.dim = dim
        self.buffer = buffer
        self.stride = stride  # read .stride(dim) instead of .size(dim)

    def __iter__(self):  # (input position, dim), as the contract describes
        yield self.input
        yield self.dim

    def __eq__(self, other):
        return isinstance(other, SizeVarSource) and (self.input, self.dim, self.buffer, self.stride) == (
            other.input, other.dim, other.buffer, other.stride)

    def __hash__(self):
        return hash((self.input, self.dim, self.buffer, self.stride))

    def python(self, arg_names: Sequence[str]) -> str:
        """Python expression reading the size from the wrapper's argument names."""
        base = self.buffer if self.buffer is not None else arg_names[self.input]
        if self.dim is None:
            return f"int({base})"
        return f"{base}.{'stride' if self.stride else 'size'}({self.dim})"

    def __repr__(self) -> str:
        where = f"buffer {self.buffer}" if self.buffer is not None else f"input {self.input}"
        if self.dim is None:
            return f"SizeVarSource({where})"
        return f"SizeVarSource({where}, {'stride' if self.stride else 'dim'} {self.dim})"


class SizeVarAllocator:
    """Maps torch's symbolic sizes (SymInt / their sympy exprs) to kiln's ``s0, s1, ...``.

    torch symbols are numbered in the order they are first seen (inputs in placeholder order,
    dims in order, then strides); torch's own names (``s0``, ``s75``, ...) are not kept.
    ``guards`` lists the facts the IR assumes (e.g. ``Eq(s0, s2)`` from broadcasting, ``s0 >= 2``
    for each dynamic size since torch specializes 0 and 1).
    """

    def __init__(self):
        self.mapping: dict[sympy.Symbol, sympy.Symbol] = {}  # torch symbol -> kiln symbol
        self.sources: dict[sympy.Symbol, SizeVarSource] = {}  # kiln symbol -> source
        self.guards: list[sympy.Basic] = []
        self._used_names: set[str] = set()
        self._next = 0
        self._shape_env = None

    def _new_symbol(self, torch_sym: sympy.Symbol) -> sympy.Symbol:
        """kiln numbers symbols s0, s1, ... in order of first appearance (so torch's names are
        kept when torch already numbered them that way)."""
        sym = size_symbol(self._next)
        self._next += 1
        self._used_names.add(sym.name)
        return sym

    def _record_hints(self, x) -> None:
        node = getattr(x, "node", None)
        env = getattr(node, "shape_env", None)
        if env is not None and env is not self._shape_env:
            self._shape_env = env

    def hint(self, expr) -> int | None:
        """The example value of a kiln size expr (from torch's ShapeEnv), None if unknown."""
        expr = sympify(expr)
        if expr.is_Integer:
            return int(expr)
        env = self._shape_env
        if env is None:
            return None
        inv = {v: k for k, v in self.mapping.items()}
        vals = getattr(env, "backed_var_to_val", None)
        if vals is None:
            vals = env.var_to_val
        subs = {}
        for s in expr.free_symbols:
            t = inv.get(s)
            if t is None or t not in vals:
                return None
            subs[s] = int(vals[t])
        try:
            return int(eval_index(expr, subs))
        except Exception:
            return None

    def bind(self, torch_expr, source: SizeVarSource) -> None:
        """Record that ``torch_expr`` (a symbol, or expr) is read from ``source``."""
        self._record_hints(torch_expr)
        e = _torch_to_sympy(torch_expr)
        if e is None or e.is_Integer:
            return
        if e.is_Symbol:
            if e not in self.mapping:
                sym = self._new_symbol(e)
                self.mapping[e] = sym
                self.sources[sym] = source
                self.guards.append(sympy.Ge(sym, 2) if source.dim is not None else sympy.true)

    def to_expr(self, x) -> sympy.Expr:
        """A kiln SymPy expr for an int / torch.SymInt / sympy expr over torch symbols."""
        self._record_hints(x)
        e = _torch_to_sympy(x)
        if e is None:
            raise TypeError(f"not a size: {x!r}")
        if e.is_Integer:
            return e
        e = convert_torch_functions(e)
        subs = {}
        for s in e.free_symbols:
            if s not in self.mapping:
                if s.name.startswith("s") or s.name.startswith("u"):
                    # an unseen symbol (unbacked or only in strides): allocate, no source yet
                    sym = self._new_symbol(s)
                    self.mapping[s] = sym
                else:
                    sym = self._new_symbol(s)
                    self.mapping[s] = sym
            subs[s] = self.mapping[s]
        return e.xreplace(subs)

    def unbound(self) -> list[sympy.Symbol]:
        return [s for s in self.mapping.values() if s not in self.sources]


def convert_torch_functions(e: sympy.Expr) -> sympy.Expr:
    """Replace torch.utils._sympy functions (FloorDiv, ModularIndexing, CleanDiv, CeilDiv,
    PythonMod, Mod, Max, Min, PowByNatural) by kiln's / SymPy's."""
    if not e.args:
        return e
    args = [convert_torch_functions(a) for a in e.args]
    name = type(e).__name__
    if isinstance(e, (FloorDiv, ModularIndexing)):
        return e.func(*args)
    if name in ("FloorDiv", "CleanDiv", "IntTrueDiv") and len(args) == 2:
        return FloorDiv(*args)
    if name == "CeilDiv" and len(args) == 2:
        return FloorDiv(args[0] + args[1] - 1, args[1])
    if name == "ModularIndexing":
        return ModularIndexing(*args)
    if name in ("PythonMod", "Mod") and len(args) == 2:
        return ModularIndexing(args[0], 1, args[1])
    if name == "PowByNatural":
        return sympy.Pow(*args)
    if name == "Max":
        return sympy.Max(*args)
    if name == "Min":
        return sympy.Min(*args)
    if isinstance(e, (sympy.Add, sympy.Mul, sympy.Pow)):
        return e.func(*args)
    if isinstance(e, sympy.Function) and type(e).__module__.startswith("torch"):
        raise NotImplementedError(f"torch sympy function {name} in a size expression")
    return e.func(*args)


def _torch_to_sympy(x):
    if isinstance(x, (sympy.Basic, int)):  # (bool is an int)
        return sympify(x)
    node = getattr(x, "node", None)
    if node is not None:
        if hasattr(node, "maybe_as_int"):
            v = node.maybe_as_int()
            if v is not None:
                return sympy.Integer(v)
        expr = getattr(node, "expr", None)
        if expr is not None:
            return sympy.sympify(expr)
    try:
        return sympy.Integer(int(x))
    except Exception:
        return None


# --------------------------------------------------------------------------------------------
# evaluating index expressions (the interpreter's indexing, size hints)
# --------------------------------------------------------------------------------------------


def eval_index(expr, env: dict, device=None):
    """Evaluate an integer SymPy expression with ``env`` {symbol: int | LongTensor}."""
    return IndexEvaluator(env, device)(expr)


class IndexEvaluator:
    """Evaluates integer SymPy index expressions over ints or LongTensors (memoized)."""

    def __init__(self, env, device):
        self.env = env
        self.device = device
        self.cache = {}

    def __call__(self, e):
        if isinstance(e, (int, bool)):
            return int(e)
        key = e
        if key in self.cache:
            return self.cache[key]
        v = self._eval(e)
        self.cache[key] = v
        return v

    def _t(self, v):
        if isinstance(v, torch.Tensor):
            return v
        return torch.tensor(v, dtype=torch.int64, device=self.device)

    def _eval(self, e):
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            if e not in self.env:
                raise KeyError(f"no value for symbol {e}")
            return self.env[e]
        if isinstance(e, sympy.Add):
            out = 0
            for a in e.args:
                out = out + self(a)
            return out
        if isinstance(e, sympy.Mul):
            out = 1
            for a in e.args:
                out = out * self(a)
            return out
        if isinstance(e, sympy.Pow):
            b, p = e.args
            if p.is_Integer and int(p) >= 0:
                return self(b) ** int(p)
            raise ValueError(f"non-integer power in index: {e}")
        if isinstance(e, FloorDiv):
            a, b = self(e.args[0]), self(e.args[1])
            return _floordiv(a, b)
        if isinstance(e, ModularIndexing):
            x, d, m = (self(a) for a in e.args)
            return _mod(_floordiv(x, d), m)
        if isinstance(e, (sympy.Min, sympy.Max)):
            tensor_op, py_op = (torch.minimum, min) if isinstance(e, sympy.Min) else (torch.maximum, max)
            vals = [self(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = tensor_op(self._t(out), self._t(v)) if _any_tensor(out, v) else py_op(out, v)
            return out
        if isinstance(e, sympy.floor):
            return _floordiv_expr(self, e.args[0])
        if isinstance(e, sympy.Mod):
            return _mod(self(e.args[0]), self(e.args[1]))
        if e.func.__name__ in ("FloorDiv", "floordiv"):
            return _floordiv(self(e.args[0]), self(e.args[1]))
        if e.func.__name__ == "ModularIndexing":
            x, d, m = (self(a) for a in e.args)
            return _mod(_floordiv(x, d), m)
        raise ValueError(f"cannot evaluate index expression {e} ({type(e).__name__})")


def _floordiv_expr(ev, arg):
    n, d = sympy.fraction(sympy.together(arg))
    return _floordiv(ev(n), ev(d))


def _any_tensor(*xs):
    return any(isinstance(x, torch.Tensor) for x in xs)


def _floordiv(a, b):
    if _any_tensor(a, b):
        return torch.div(a, b, rounding_mode="floor")
    return a // b


def _mod(a, b):
    if _any_tensor(a, b):
        return torch.remainder(a, b)
    return a % b
