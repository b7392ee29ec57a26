"""guards.GUARD_KINDS: one row per guard kind carries its C leaf checks, its Python
expression, its failure text and its tree rule (issue 26)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from kiln_frontend import guards
from kiln_frontend.guards import GUARD_KINDS, Guard, GuardKind, guard_kind_row
from kiln_frontend.sources import LocalSource

#: the C source in this checkout (an installed, non-editable kiln_frontend ships no .c files)
C_SOURCE = Path(__file__).resolve().parents[1] / "src" / "kiln_frontend" / "_guardtree.c"

X = LocalSource("x")

#: per sourced kind: a guard on ``x``, a value it passes on, a value it fails on, and a
#: piece of the failure text
CASES = {
    GuardKind.TYPE_MATCH: (Guard(X, GuardKind.TYPE_MATCH, int), 3, "a", "type(L['x']) is int"),
    GuardKind.CONSTANT_MATCH: (Guard(X, GuardKind.CONSTANT_MATCH, 2.5), 2.5, 3.5,
                               "L['x'] == 2.5 (actual 3.5)"),
    GuardKind.LIST_LENGTH: (Guard(X, GuardKind.LIST_LENGTH, (list, 2)), [1, 2], [1],
                            "len(L['x']) == 2 (actual 1)"),
    GuardKind.DICT_KEYS: (Guard(X, GuardKind.DICT_KEYS, (dict, ("a",))), {"a": 1}, {"b": 1},
                          "list(L['x'].keys()) == ['a']"),
    GuardKind.HASATTR: (Guard(X, GuardKind.HASATTR, ("real", True)), 1, object(),
                        "hasattr(L['x'], 'real') is True"),
}


def _c_leaf_names() -> set[str]:
    table = re.search(r"leaf_names\[LEAF_COUNT\]\s*=\s*\{(.*?)\};", C_SOURCE.read_text(), re.S)
    assert table is not None, "leaf_names not found in _guardtree.c"
    return set(re.findall(r'"(\w+)"', table.group(1)))


def test_every_kind_has_one_row():
    assert set(GUARD_KINDS) == set(GuardKind)
    assert all(row.kind is kind for kind, row in GUARD_KINDS.items())
    with pytest.raises(ValueError, match="TYPE_MATCH has two rows"):
        guards._row(GuardKind.TYPE_MATCH, order=0, c_check=("type",), expr=str, failure=str,
                    leaves=lambda b, g: False)


def test_a_rows_c_checks_are_leaf_kinds_of_the_guard_tree():
    names = _c_leaf_names()
    for kind, row in GUARD_KINDS.items():
        assert row.c_check and set(row.c_check) <= names, (kind, row.c_check, names)


@pytest.mark.parametrize("kind", sorted(CASES, key=str))
def test_a_row_is_the_guards_expression_failure_text_and_tree_leaves(kind):
    guard, good, bad, failure = CASES[kind]
    row = guard_kind_row(kind)
    ns = guards._Namespace()
    check = eval(f"lambda x: {guard.expr(ns)}", dict(ns.values))
    assert check(good) and not check(bad)
    assert failure in guard.describe_failure(bad)
    builder = guards._TreeBuilder(["x"], {}, "<test>")
    builder.add(guard)
    root = builder.finish()
    leaf_kinds = {leaf.kind for node in _nodes(root) for leaf in node.leaves}
    assert leaf_kinds and leaf_kinds <= set(row.c_check), (leaf_kinds, row.c_check)
    check_fn = guards.build_check_fn([guard], ["x"], {})
    assert check_fn(good) and not check_fn(bad)
    assert failure in check_fn.failure_reason(bad)


def test_sourceless_rows_need_no_source():
    grad = Guard(None, GuardKind.GRAD_MODE, torch.is_grad_enabled())
    assert not guard_kind_row(GuardKind.GRAD_MODE).sourced
    ns = guards._Namespace()
    assert eval(grad.expr(ns), dict(ns.values)) is True
    assert "grad mode changed" in grad.describe_failure(None)


def _nodes(node):
    yield node
    for child in node.children.values():
        yield from _nodes(child)
