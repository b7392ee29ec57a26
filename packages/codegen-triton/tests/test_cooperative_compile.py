"""The cooperative long-row kernel (cooperative.py) compiles for sm_90 without a GPU.

The interpreter never runs the cooperative kernel with K > 1 (its spin would hang), so the
only CI check that Triton accepts the generated code is a real compile: ``triton.compile``
to a CUDA target, down to a cubin (ptxas ships in the triton wheel). Triton 3.6 failed here
(RemoveLayoutConversions on the spin loop, see cooperative.py); with Triton 3.6 on
PYTHONPATH this same test is how that was reproduced and checked.
"""

from __future__ import annotations

import pytest
import torch
from _triton_sm90 import compile_job

pytest.importorskip("triton")

#: torch dtype -> Triton signature type of a pointer to it
_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
        torch.int64: "*i64", torch.int32: "*i32", torch.bool: "*i1"}

#: compiles ``module.kiln_kernel`` once per (constexprs, options) variant (_triton_sm90.PRELUDE)
_COMPILE = """
fn = module.kiln_kernel
# the types are given in the wrapper's argument order; the kernel names its parameters by
# position (out_ptr0, in_ptr0, ...), the extra ones as given
assert len(job["signature"]) == len(fn.arg_names), (list(job["signature"]), fn.arg_names)
assert all(a == p or p.startswith(("in_ptr", "out_ptr")) for a, p in zip(job["signature"], fn.arg_names)), \
    (list(job["signature"]), fn.arg_names)
signature = dict(zip(fn.arg_names, job["signature"].values()))
attrs = pointer_attrs(signature)
out = []
for consts, opts in job["variants"]:
    src = triton.compiler.ASTSource(fn, signature, consts, attrs)
    compiled = triton.compile(src, target=SM90, options=opts)
    out.append({"cubin_bytes": len(compiled.asm["cubin"]), "ptx": compiled.asm["ptx"]})
print(json.dumps({"version": triton.__version__, "kernels": out}))
"""


def _compile_sm90(tmp_path, source: str, signature: dict, variants: list) -> dict:
    """Compile ``source``'s ``kiln_kernel`` for sm_90 once per (constexprs, num_warps)."""
    path = tmp_path / "kiln_coop_kernel.py"
    path.write_text(source)
    return compile_job(_COMPILE, {"path": str(path), "signature": signature, "variants": variants})


def _cooperative_softmax_spec(monkeypatch, shape, design: str = "1"):
    import kiln_loopir
    from kiln_codegen_triton import TritonCodegen
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    monkeypatch.setenv("KILN_TRITON_COOPERATIVE", design)
    x = torch.empty(shape)  # never touched: traced with fake tensors
    gm = make_fx(lambda x: torch.softmax(x, -1), decomposition_table=core_aten_decompositions(),
                 tracing_mode="fake")(x)
    sched = kiln_loopir.schedule(kiln_loopir.lower(gm, [x]))
    module = kiln_loopir.generate_wrapper(sched, TritonCodegen(interpret=False))
    (kernel,) = module.kernels
    spec = kernel.meta["spec"]
    assert spec.cooperative_parts, kernel.meta["tiling"]
    assert ("registers" in kernel.meta["tiling"]) == (design in ("1", "lagged")), kernel.meta["tiling"]
    assert ("lagged" in kernel.meta["tiling"]) == (design == "lagged"), kernel.meta["tiling"]
    return spec


@pytest.mark.parametrize("design", ["1", "reread"])
def test_cooperative_softmax_compiles_for_sm90(monkeypatch, tmp_path, design):
    """softmax of 1024 x 262144 float32 (the H200 case), every autotuning config of both
    designs (registers: the default; the re-read one), to cubin; the ticket and the spin
    survive as an acq_rel atomic and acquire polls in the PTX; the registers kernel's one read of its
    chunk is vectorised (128-bit loads)."""
    from kiln_codegen_triton.cooperative import split_row

    spec = _cooperative_softmax_spec(monkeypatch, (1024, 262144), design)
    signature = {name: _PTR[dt] for name, dt in zip(spec.arg_names, spec.arg_dtypes, strict=True)}
    signature.update({"coop_ws": "*fp32", "coop_tickets": "*i64", "rchunk": "i32", "nsplit": "i32",
                      "XBLOCK": "constexpr", "RBLOCK": "constexpr", "SPLITB": "constexpr"})
    assert spec.configs
    variants = []
    for config in spec.configs:  # SPLITB as the launcher picks it (launcher._coop_args)
        _, k = split_row(262144, config["RBLOCK"], config.get("CHUNK_BYTES"))
        consts = {"XBLOCK": config["XBLOCK"], "RBLOCK": config["RBLOCK"], "SPLITB": 1 << max(0, (k - 1).bit_length())}
        variants.append((consts, {k: config[k] for k in ("num_warps", "maxnreg") if k in config}))
    result = _compile_sm90(tmp_path, spec.source, signature, variants)
    assert len(result["kernels"]) == len(variants)
    for (consts, _), kernel in zip(variants, result["kernels"], strict=True):
        assert kernel["cubin_bytes"] > 0, consts
        assert "atom.global.gpu.acq_rel.add" in kernel["ptx"], consts
        # the poll of the row's (scalar) counter: an acquire load (Triton 3.6) or atomic
        assert "ld.global.gpu.acquire" in kernel["ptx"] or "atom.global.gpu.acquire.add" in kernel["ptx"], consts
        if design == "1":
            assert "ld.global.v4.b32" in kernel["ptx"] or "ld.global.L1::evict_first.v4.b32" in kernel["ptx"], consts


def test_lagged_softmax_compiles_for_sm90(monkeypatch, tmp_path):
    """The default design (lagged units) for 1024 x 262144 float32, every autotuning config,
    to cubin: the stats unit's release count, the normalize unit's acquire polls, its chunk's
    vectorised 128-bit loads with their L2 hints."""
    from kiln_codegen_triton.cooperative import split_row

    spec = _cooperative_softmax_spec(monkeypatch, (1024, 262144), "lagged")
    signature = {name: _PTR[dt] for name, dt in zip(spec.arg_names, spec.arg_dtypes, strict=True)}
    signature.update({"coop_ws": "*fp32", "coop_tickets": "*i64", "rchunk": "i32", "nsplit": "i32",
                      "nunits": "i32", "coop_lag": "i32",
                      "XBLOCK": "constexpr", "RBLOCK": "constexpr", "SPLITB": "constexpr"})
    variants = []
    for config in spec.configs:
        _, k = split_row(262144, config["RBLOCK"], config.get("CHUNK_BYTES"), lagged=True)
        consts = {"XBLOCK": config["XBLOCK"], "RBLOCK": config["RBLOCK"], "SPLITB": 1 << max(0, (k - 1).bit_length())}
        variants.append((consts, {k: config[k] for k in ("num_warps", "maxnreg") if k in config}))
    assert len(variants) >= 3
    result = _compile_sm90(tmp_path, spec.source, signature, variants)
    for (consts, _), kernel in zip(variants, result["kernels"], strict=True):
        ptx = kernel["ptx"]
        assert kernel["cubin_bytes"] > 0, consts
        assert "atom.global.gpu.release.add" in ptx or "red.global.gpu.release.add" in ptx, consts
        assert "ld.global.gpu.acquire" in ptx or "atom.global.gpu.acquire.add" in ptx, consts
        assert "evict_last" in ptx and "evict_first" in ptx, consts
