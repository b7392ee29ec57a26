"""Corpus: what graph-breaks (and stays correct) — print, logging, numpy, random, tensor ->
Python values, unknown C functions, data-dependent branches, generators, breaks inside
inlined calls and loops — and what fullgraph says about it."""

from __future__ import annotations

import functools
import logging
import os
import random

import numpy as np
import pytest
import torch
from _harness import Case as _Case
from _harness import case_params, check_case

# a logger outside the hierarchy: pytest's capture handler (a list that grows, so its
# emit frame recompiles on every record) is not the point here
log = logging.Logger("kiln.test.corpus")
log.addHandler(logging.NullHandler())

#: every case here also runs a second time on new tensor values
Case = functools.partial(_Case, fresh_inputs=True)


def _t(*shape):
    return torch.randn(*shape)


def break_print(x):
    y = x * 2
    print("value", y.shape)
    return y + 1


def break_logging(x):
    y = x.sin()
    log.warning("shape %s", tuple(y.shape))
    return y.cos()


def break_item(x):
    s = x.sum().item()
    return x * s


def break_branch_on_item(x):
    if x.sum().item() > 0:
        return x + 1
    return x - 1


def break_tolist(x):
    vals = x.tolist()
    return x + len(vals), vals


def break_int_of_tensor(x):
    n = int(x.max())
    return x * n


def break_bool_branch(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def break_numpy(x):
    y = x + 1
    z = np.ones(3).sum()
    return y * float(z)


def break_random(x):
    y = x * 3
    r = random.random()
    return y, r >= 0.0


def break_unknown_c_function(x):
    y = x.exp()
    pid = os.getpid()
    return y * 2, pid > 0


def _inner_data_dependent(x):
    if x.mean() > 10:
        return x * 100
    return x - 1


def break_in_inlined_call(x):
    y = x.cos()
    z = _inner_data_dependent(y)
    return z.sin()


def break_in_loop_frame_runs_eagerly(x):
    # no graph break inside loops: this frame runs as is (nothing compiled)
    for _ in range(2):
        x = x + 1
        print("in loop")
    return x


def _gen(x):
    yield x * 2
    yield x * 3


def generator_frame_runs_as_is(x):
    return list(_gen(x))


def _count():
    i = 0
    while True:
        yield i
        i += 1


def endless_generator(x, xs):
    # an inlined generator runs to its end: an endless one is a graph break, not a hang
    y = x * 2
    for i, t in zip(_count(), xs, strict=False):
        y = y + t * i
    return y


def break_then_mutation(x):
    x.add_(1)
    print("after the in-place op")
    x.mul_(2)
    return x


def break_nonzero(x):
    idx = torch.nonzero(x > 0)
    return idx, x * 2


def break_keeps_locals(x, y):
    a = x + y
    b = [a, x]
    d = {"k": y}
    print("break")
    return b[0] * d["k"] + b[1]


CASES = [
    Case(break_print, (_t(3),), 2),
    Case(break_logging, (_t(3),), 2),
    Case(break_item, (_t(3),), 2, fresh_inputs=False),  # breaks; fullgraph captures it
    Case(break_tolist, (_t(3),), 1, fresh_inputs=False),  # specializes on the value
    Case(break_int_of_tensor, (_t(3),), 2, fresh_inputs=False),  # breaks; fullgraph captures
    Case(break_branch_on_item, (_t(3),), 2, fresh_inputs=False),  # specializes on the value
    Case(break_bool_branch, (_t(3),), 2),
    Case(break_numpy, (_t(3),), 2),
    Case(break_random, (_t(3),), 1, mutate_check=lambda a: a),
    Case(break_unknown_c_function, (_t(3),), 2),
    Case(break_in_inlined_call, (_t(3),), 4),
    Case(break_in_loop_frame_runs_eagerly, (_t(3),), 0),
    Case(generator_frame_runs_as_is, (_t(3),), 1),
    Case(endless_generator, (_t(3), [_t(3), _t(3)]), 1),
    Case(break_then_mutation, (_t(3),), 2),
    Case(break_nonzero, (_t(3),), 1),  # captured: an unbacked size (issue 10)
    Case(break_keeps_locals, (_t(3), _t(3)), 2),
]


@case_params(CASES)
def test_break_case(case):
    case.check()


@pytest.mark.parametrize("fn,match", [
    (break_print, "print"),
    (break_branch_on_item, "data-dependent branch"),  # (fullgraph captures the item)
    (break_bool_branch, "data-dependent branch"),
    (break_in_inlined_call, "data-dependent branch"),
])
def test_fullgraph_names_file_and_line(fn, match):
    import kiln_frontend

    with pytest.raises(kiln_frontend.Unsupported, match=match) as info:
        check_case(fn, (_t(3),), 1, fullgraph=True)
    assert "test_corpus_breaks.py:" in str(info.value)
