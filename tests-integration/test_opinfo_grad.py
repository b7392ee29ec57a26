"""A CI slice of the OpInfo sweep in grad mode (``opinfo_harness.py --grad``, issue 12).

Every float input requires grad; the op runs through the ``kiln`` backend's training path
(joint trace -> min-cut -> forward and backward graphs as generated C++) and its outputs and
the input grads (``torch.autograd.grad`` with seeded cotangents) must match eager. One sample
per op keeps this under a minute on 2 cores; the full sweep is
``python tests-integration/opinfo_harness.py --grad --backends kiln --jobs 2``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import opinfo_harness as harness  # noqa: E402

GRAD_OPS = [
    "mul",
    "div.no_rounding_mode",
    "exp",
    "tanh",
    "sigmoid",
    "sum",
    "amax",
    "softmax",
    "log_softmax",
    "nn.functional.layer_norm",
    "nn.functional.gelu",
    "mm",
    "cat",
    "where",
]


@pytest.fixture(scope="module", autouse=True)
def _grad_mode(tmp_path_factory):
    old_cache = os.environ.get("KILN_CACHE_DIR")
    os.environ["KILN_CACHE_DIR"] = str(tmp_path_factory.mktemp("kiln-cache"))
    harness.GRAD_MODE = True
    yield
    harness.GRAD_MODE = False
    if old_cache is None:
        os.environ.pop("KILN_CACHE_DIR", None)
    else:
        os.environ["KILN_CACHE_DIR"] = old_cache


_passed: list[str] = []


@pytest.mark.parametrize("key", GRAD_OPS)
def test_kiln_grad(key):
    result = harness.check_op(harness.find_op(key), ["kiln"], samples=1, timeout=120)
    r = result["backends"]["kiln"]
    assert r["status"] == "pass", (
        f"{key} (grad mode): [{r.get('stage')}] {r.get('error')} (raised at {r.get('where')})"
    )
    assert not r.get("eager_fallbacks"), f"{key}: the graph ran eagerly"
    _passed.append(key)
    print(f"\ngrad-mode OpInfo slice: {len(_passed)}/{len(GRAD_OPS)} passed so far")
