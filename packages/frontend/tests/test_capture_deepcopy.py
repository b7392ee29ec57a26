"""``copy.deepcopy`` / ``copy.copy`` inside a captured frame (issue 10: transformers copies
its configs in ``forward``), and objects made in the frame whose class has its own Python
``__getattribute__`` / ``__setattr__`` (name maps, validation), ``__len__``/``__bool__``.
Each case is one graph, agrees with eager, and the original object is left as it was; what
the copy read is guarded on the original."""

from __future__ import annotations

import copy

import pytest
import torch
from _counting_backend import CountingBackend, check_calls
from kiln_frontend import compile as kiln_compile
from kiln_frontend import reset
from kiln_frontend.exc import Unsupported

pytestmark = pytest.mark.usefixtures("fresh_frontend")


class Config:
    def __init__(self):
        self.layers = 2
        self.scales = [1.0, 2.0]
        self.extra = {"bias": 0.5, "nested": {"k": 3}}


class MappedConfig:
    """Like transformers' PretrainedConfig: names mapped on read and write, writes
    validated, reads going through ``super().__getattribute__``."""

    attribute_map = {"num_layers": "layers"}

    def __init__(self):
        self.layers = 2
        self.decoder_layers = 3

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        if not isinstance(value, int):
            raise TypeError(f"{key} must be an int")
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)


CFG = Config()
MAPPED = MappedConfig()


def test_deepcopy_of_a_config_is_one_graph_and_leaves_the_original():
    def f(x):
        c = copy.deepcopy(CFG)
        c.layers = 5
        c.scales.append(3.0)
        c.extra["nested"]["k"] = 7
        return x * c.layers * sum(c.scales) + c.extra["nested"]["k"] + CFG.layers

    check_calls(f, (torch.ones(2),), (torch.ones(2),))
    assert CFG.layers == 2 and CFG.scales == [1.0, 2.0] and CFG.extra["nested"]["k"] == 3


def test_copy_reads_are_guarded_on_the_original():
    def f(x):
        return x * copy.deepcopy(CFG).extra["nested"]["k"]

    backend = CountingBackend()
    compiled = kiln_compile(f, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(torch.ones(2)), f(torch.ones(2)))
    CFG.extra["nested"]["k"] = 11
    try:
        torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 11.0))
    finally:
        CFG.extra["nested"]["k"] = 3
    assert len(backend.graphs) == 2


def test_deepcopy_keeps_shared_structure_and_shallow_copy_shares():
    shared = [1.0]

    class Pair:
        def __init__(self):
            self.a = shared
            self.b = shared

    pair = Pair()

    def f(x):
        deep = copy.deepcopy(pair)
        deep.a.append(2.0)  # deep.b is deep.a, as in eager
        shallow = copy.copy(pair)
        return x * len(deep.b) + len(shallow.a), deep.a is deep.b, shallow.a is pair.a

    check_calls(f, (torch.ones(2),))
    assert shared == [1.0]


def test_mapped_getattribute_and_validated_setattr_on_a_copy():
    def f(x):
        c = copy.deepcopy(MAPPED)
        c.num_layers = c.decoder_layers  # written through the map
        del c.decoder_layers
        return x * c.layers + c.num_layers, hasattr(c, "decoder_layers")

    check_calls(f, (torch.ones(2),))
    assert MAPPED.layers == 2 and MAPPED.decoder_layers == 3


def test_validation_error_in_setattr_is_not_swallowed():
    def f(x):
        c = copy.deepcopy(MAPPED)
        c.layers = "two"
        return x

    with pytest.raises((TypeError, Unsupported)):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.ones(2))


def test_deepcopy_of_a_tensor_or_custom_protocol_breaks_and_is_correct():
    class Custom:
        def __deepcopy__(self, memo):
            return 5

    custom = Custom()

    def f(x):
        return x * copy.deepcopy(custom) + copy.deepcopy(x)

    with pytest.raises(Unsupported, match="copy.deepcopy"):
        kiln_compile(f, backend=CountingBackend(), fullgraph=True)(torch.ones(2))
    reset()
    backend = CountingBackend()
    out = kiln_compile(f, backend=backend)(torch.ones(2))
    torch.testing.assert_close(out, f(torch.ones(2)))


def test_truth_of_an_object_made_in_the_frame():
    class Cache:
        def __init__(self, n):
            self.layers = [0] * n

        def __len__(self):
            return len(self.layers)

    class Plain:
        pass

    def f(x):
        y = x + 1 if Cache(2) else x
        y = y * 2 if not Cache(0) else y
        return y + 1 if Plain() else y

    check_calls(f, (torch.ones(2),))
