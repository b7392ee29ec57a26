"""Compiling a generated Triton module for sm_90 without a GPU (not a test module).

These tests import triton under TRITON_INTERPRET=1 (conftest.py), which makes every
``@triton.jit`` (triton.language's own ``tl.max``, ``tl.sum``, ...) an interpreter function
that ``triton.compile`` cannot lower, so the compile runs in a fresh process without it:
``compile_job(body, job)`` runs ``body`` there after ``PRELUDE``, which reads ``job`` (JSON
on stdin), skips where this triton has no nvidia backend, imports ``job["path"]`` as
``module`` and defines ``SM90`` (the target) and ``pointer_attrs(signature)``. ``body``
prints its result as the last line, in JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PRELUDE = """
import importlib.util, json, sys
import triton
from triton.backends import backends
from triton.backends.compiler import GPUTarget
job = json.loads(sys.stdin.read())
if "nvidia" not in backends:
    print(json.dumps({"skip": "this triton has no nvidia backend: cannot compile to a CUDA target"}))
    sys.exit(0)
spec = importlib.util.spec_from_file_location("kiln_sm90_kernel", job["path"])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
SM90 = GPUTarget("cuda", 90, 32)


def pointer_attrs(signature):
    return {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t.startswith("*")}
"""


def compile_job(body: str, job: dict) -> dict:
    """What ``body`` printed, run after ``PRELUDE`` in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + body], input=json.dumps(job),
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:  # pragma: no cover - depends on the installed triton
        pytest.skip(result["skip"])
    return result
