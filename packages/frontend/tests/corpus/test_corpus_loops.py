"""Corpus: loops over Python values are unrolled — ranges, lists, tuples, dict items, module
containers, ``while`` on Python values, ``break``/``continue``, nested loops, else."""

from __future__ import annotations

import functools

import torch
from _harness import Case as _Case
from _harness import case_params
from torch import nn

#: every case here also runs a second time on new tensor values
Case = functools.partial(_Case, fresh_inputs=True)


def _t(*shape):
    return torch.randn(*shape)


def loop_range_step(x):
    for i in range(10, 0, -3):
        x = x * 0.5 + i
    return x


def loop_list_of_tensors(x, ws):
    for w in ws:
        x = torch.tanh(x @ w)
    return x


def loop_tuple_of_constants(x):
    for s in (1.0, 2.0, 0.5):
        x = x * s
    return x


def loop_dict_items(x, d):
    for k, v in d.items():
        if k.startswith("add"):
            x = x + v
        else:
            x = x * v
    for k in d:
        x = x - len(k)
    return x


def loop_while_python(x):
    n = 0
    while n < 5:
        x = x + n
        n += 1
    return x, n


def loop_break_continue(x):
    for i in range(10):
        if i % 2 == 0:
            continue
        if i > 6:
            break
        x = x * i
    return x


def loop_for_else(x):
    for i in range(3):
        if i == 5:
            break
    else:
        x = x + 100
    return x


def loop_nested(x):
    acc = torch.zeros_like(x)
    for i in range(3):
        for j in range(i):
            acc = acc + x * (i + j)
    return acc


def loop_while_true_break(x):
    i = 0
    while True:
        x = x.cos()
        i += 1
        if i == 4:
            break
    return x


def loop_accumulate_list(x):
    outs = []
    for i in range(4):
        outs.append(x[i] * i)
    return torch.stack(outs), [o.shape for o in outs]


def loop_over_tensor_rows(x):
    total = 0
    for row in x:
        total = total + row.sum()
    return total


def loop_enumerate_zip(x, ws, bs):
    for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
        x = x @ w + b * i
    return x


def loop_over_shape(x):
    out = x
    for d in x.shape:
        out = out * d
    return out


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(4)])
        self.norms = nn.ModuleDict({"a": nn.LayerNorm(6), "b": nn.LayerNorm(6)})

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i % 2:
                x = x + layer(x)
            else:
                x = layer(x).relu()
        for _name, norm in self.norms.items():
            x = norm(x)
        return x


def loop_module_containers(m, x):
    return m(x)


def loop_while_on_list(x):
    todo = [1, 2, 3]
    while todo:
        x = x * todo.pop()
    return x


CASES = [
    Case(loop_range_step, (_t(3),), 1, fullgraph=True),
    Case(loop_list_of_tensors, (_t(2, 4), [_t(4, 4) for _ in range(3)]), 1, fullgraph=True),
    Case(loop_tuple_of_constants, (_t(3),), 1, fullgraph=True),
    Case(loop_dict_items, (_t(3), {"add_a": _t(3), "mul": _t(3), "add_b": _t(3)}), 1,
         fullgraph=True),
    Case(loop_while_python, (_t(3),), 1, fullgraph=True),
    Case(loop_break_continue, (_t(3),), 1, fullgraph=True),
    Case(loop_for_else, (_t(3),), 1, fullgraph=True),
    Case(loop_nested, (_t(3),), 1, fullgraph=True),
    Case(loop_while_true_break, (_t(3),), 1, fullgraph=True),
    Case(loop_accumulate_list, (_t(4, 3),), 1, fullgraph=True),
    Case(loop_over_tensor_rows, (_t(3, 2),), 1, fullgraph=True),
    Case(loop_enumerate_zip, (_t(2, 3), [_t(3, 3), _t(3, 3)], [_t(3), _t(3)]), 1,
         fullgraph=True),
    Case(loop_over_shape, (_t(2, 3),), 1, fullgraph=True),
    Case(loop_module_containers, (Stack(), _t(2, 6)), 1, fullgraph=True),
    Case(loop_while_on_list, (_t(3),), 1, fullgraph=True),
]


@case_params(CASES)
def test_loop_case(case):
    case.check()
