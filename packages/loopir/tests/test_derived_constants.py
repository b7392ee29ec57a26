"""Derived constants (``kiln_loopir.derived_constants``): one registry of named
derivations, constants that print their recipe, and the standalone output_code.py deriving
them again."""

from __future__ import annotations

import pytest
import torch
from kiln_loopir import derived_constants


def test_a_duplicate_derivation_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        derived_constants.derivation("channels_last")(lambda w: w)


def test_an_unknown_derivation_names_the_known_ones():
    with pytest.raises(KeyError, match="channels_last"):
        derived_constants.derive("no_such_derivation", torch.ones(2))


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="needs MKL")
def test_a_packed_weight_computes_what_the_weight_does():
    torch.manual_seed(0)
    w, x = torch.randn(12, 5), torch.randn(3, 5)
    packed = derived_constants.derive("mkl_packed_linear", w, 3)
    got = torch.ops.mkl._mkl_linear(x, packed, w, None, 3)
    torch.testing.assert_close(got, x @ w.t())


@pytest.mark.skipif(not hasattr(torch.ops.mkldnn, "_linear_pointwise")
                    or not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
@pytest.mark.parametrize("in_out", [False, True])
def test_a_onednn_packed_weight_computes_what_the_weight_does(in_out):
    """``[out, in]`` (a linear weight) or ``[in, out]`` (GPT-2's Conv1D, packed transposed)."""
    torch.manual_seed(0)
    w, x = torch.randn(12, 5), torch.randn(3, 5)
    packed = derived_constants.derive("onednn_packed_linear", w.t().contiguous() if in_out else w, 3,
                                      *([True] if in_out else []))
    got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    torch.testing.assert_close(got, x @ w.t())


def test_channels_last_keeps_values():
    w = torch.randn(4, 3, 2, 2)
    got = derived_constants.derive("channels_last", w)
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, w)
