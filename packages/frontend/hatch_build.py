"""Build kiln_frontend's C extension (_evalframe) for hatchling, or in place.

hatchling loads this file as a custom build hook (see `[tool.hatch.build.targets.wheel.hooks
.custom]` in pyproject.toml):

- regular wheel (`pip install ./packages/frontend`): compiles `src/kiln_frontend/_evalframe.c`
  and `_guardtree.c` (one module) with the running interpreter's compiler settings
  (sysconfig: CC, CFLAGS, CCSHARED, LDSHARED, include dir, EXT_SUFFIX) into a temporary
  folder, force-includes the result as `kiln_frontend/_evalframe<EXT_SUFFIX>`, and marks the
  wheel non-pure with the interpreter's tag (e.g. cp311-cp311-linux_x86_64).
- editable wheel (`pip install -e ./packages/frontend`): compiles the extension in place,
  beside the sources, where the editable install's path entry finds it.

Without pip, for a development checkout:

    python packages/frontend/hatch_build.py --inplace

compiles `src/kiln_frontend/_evalframe<EXT_SUFFIX>` for the interpreter that runs it. The
compiler can be overridden with the CC environment variable (and extra flags with CFLAGS).

Where torch is importable at build time (``--inplace``, or pip with
``--no-build-isolation``) it also compiles the optional C++ module ``_tensorcheck`` (CXX,
torch's headers and libraries): TensorGuard's fast path, reading tensor metadata from the
TensorImpl.  Without it (an isolated build, no C++ compiler, a failed build: a warning)
TensorGuard reads the same facts through Python attributes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "src" / "kiln_frontend" / "_evalframe.c"
#: the C files linked into the one _evalframe module (the hook and TensorGuard, GuardTree)
SOURCES = (SOURCE, SOURCE.parent / "_guardtree.c")
MODULE = "_evalframe"


def extension_filename() -> str:
    return MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    parts = shlex.split(cc)
    if not shutil.which(parts[0]):
        # The interpreter may have been built with a compiler this machine lacks.
        for fallback in ("cc", "gcc", "clang"):
            if shutil.which(fallback):
                return [fallback, *parts[1:]]
        raise RuntimeError(f"kiln-frontend: no C compiler found (tried {parts[0]!r}, cc, gcc, clang)")
    return parts


def _has_tier2_optimizer() -> bool:
    """The interpreter was built with CPython's tier-2 optimizer (3.13+ ``--enable-experimental-jit``
    and its ``=interpreter`` form: ``_Py_TIER2``, which only CPython's own sources see): there
    installing an eval function must also invalidate its executors, so _evalframe installs
    through CPython's setter (_kiln_internal.h, EVAL_FRAME_SET)."""
    flags = " ".join(str(sysconfig.get_config_var(name) or "")
                     for name in ("PY_CORE_CFLAGS", "PY_CFLAGS_NODIST", "CONFIG_ARGS"))
    return "_Py_TIER2" in flags or "experimental-jit" in flags


def build_extension(out_dir: str | os.PathLike[str], *, verbose: bool = False) -> Path:
    """Compile _evalframe.c and _guardtree.c into one module in out_dir; returns the path of
    the shared library."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / extension_filename()
    cc = _compiler()
    cflags = shlex.split(sysconfig.get_config_var("CFLAGS") or "")
    cflags += shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC")
    if not any(flag.startswith("-O") for flag in cflags):
        cflags.append("-O2")
    if _has_tier2_optimizer():
        cflags.append("-DKILN_PY_TIER2=1")
    cflags += shlex.split(os.environ.get("KILN_EXTRA_CFLAGS", ""))
    include = sysconfig.get_paths()["include"]
    plat_include = sysconfig.get_paths().get("platinclude", include)
    ldshared = shlex.split(sysconfig.get_config_var("LDSHARED") or "")
    # LDSHARED starts with the compiler the interpreter was built with; use ours instead.
    ldflags = [flag for flag in ldshared[1:]] if ldshared else ["-shared"]
    if "-shared" not in ldflags:
        ldflags.append("-shared")
    with tempfile.TemporaryDirectory() as tmp:
        objs = [Path(tmp) / (src.stem + ".o") for src in SOURCES]
        compile_cmds = [[
            *cc, *cflags, "-std=gnu11", "-I", include, "-I", plat_include, "-I", str(SOURCE.parent),
            "-c", str(src), "-o", str(obj),
        ] for src, obj in zip(SOURCES, objs, strict=True)]
        link_cmd = [*cc, *ldflags, *map(str, objs), "-o", str(target)]
        for cmd in (*compile_cmds, link_cmd):
            if verbose:
                print(" ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(
                    "kiln-frontend: building the _evalframe extension failed:\n"
                    f"$ {' '.join(cmd)}\n{result.stdout}{result.stderr}"
                )
    return target


CXX_SOURCE = HERE / "src" / "kiln_frontend" / "_tensorcheck.cpp"
CXX_MODULE = "_tensorcheck"


def _torch_build_flags() -> tuple[list[str], list[str]] | None:
    """Compile and link flags for torch's C++ headers and libraries, or None where torch is
    not importable (an isolated build environment): then _tensorcheck is not built and
    TensorGuard reads tensors through Python attributes."""
    try:
        import torch
    except ImportError:
        return None
    root = Path(torch.__file__).resolve().parent
    lib = root / "lib"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cflags = ["-I", str(root / "include"), "-I", str(root / "include" / "torch" / "csrc" / "api"
                                                      / "include"),
              f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    ldflags = ["-L", str(lib), "-lc10", "-ltorch_cpu", "-ltorch_python",
               f"-Wl,-rpath,{lib}"]
    return cflags, ldflags


def _cxx_compiler() -> list[str] | None:
    cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    parts = shlex.split(cxx)
    if shutil.which(parts[0]):
        return parts
    for fallback in ("c++", "g++", "clang++"):
        if shutil.which(fallback):
            return [fallback]
    return None


def build_tensorcheck(out_dir: str | os.PathLike[str], *, verbose: bool = False) -> Path | None:
    """Compile the optional C++ fast path of TensorGuard (_tensorcheck.cpp) into out_dir;
    None (with a note on stderr) where torch's headers or a C++ compiler are missing."""
    torch_flags = _torch_build_flags()
    cxx = _cxx_compiler()
    if torch_flags is None or cxx is None:
        print("kiln-frontend: _tensorcheck not built (needs torch and a C++ compiler); "
              "TensorGuard uses its Python-attribute path", file=sys.stderr)
        return None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / (CXX_MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    include = sysconfig.get_paths()["include"]
    cmd = [*cxx, "-O2", "-std=c++20", "-fPIC", "-shared", "-w", "-I", include,
           "-I", str(CXX_SOURCE.parent), *torch_flags[0], str(CXX_SOURCE), "-o", str(target),
           *torch_flags[1]]
    if verbose:
        print(" ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:  # optional: a warning, and TensorGuard's Python path
        print("kiln-frontend: warning: building the optional _tensorcheck extension failed; "
              "TensorGuard uses its Python-attribute path (slower, same result):\n"
              f"$ {' '.join(cmd)}\n{result.stdout}{result.stderr[-4000:]}", file=sys.stderr)
        target.unlink(missing_ok=True)
        return None
    return target


def build_inplace(*, verbose: bool = False) -> Path:
    build_tensorcheck(SOURCE.parent, verbose=verbose)
    return build_extension(SOURCE.parent, verbose=verbose)


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script without hatchling installed
    BuildHookInterface = object  # type: ignore[assignment,misc]


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    """hatchling hook: compile the extension and put it into the wheel."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version == "editable":
            build_inplace()
            return
        self._tmp = tempfile.mkdtemp(prefix="kiln-frontend-build-")
        built = build_extension(self._tmp)
        build_data["force_include"][str(built)] = f"kiln_frontend/{built.name}"
        fast = build_tensorcheck(self._tmp)
        if fast is not None:
            build_data["force_include"][str(fast)] = f"kiln_frontend/{fast.name}"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inplace", action="store_true", help="build beside the sources")
    parser.add_argument("--out", help="build into this folder instead")
    parser.add_argument("-v", "--verbose", action="store_true")
    ns = parser.parse_args()
    if not ns.inplace and not ns.out:
        parser.error("give --inplace or --out DIR")
    path = build_inplace(verbose=ns.verbose) if ns.inplace else build_extension(ns.out, verbose=ns.verbose)
    print(path)
