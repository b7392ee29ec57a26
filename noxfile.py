"""Every install and test session of the kiln monorepo.

Each per-package session installs only that package and its declared kiln dependencies, so an
undeclared import between packages fails here. `tests` (the README's test command, which CI
runs) runs each of them and then `integration`: tests-integration against one full install.
`tests_py313` runs the frontend on CPython 3.13 (CI too); `demo` runs the README's first
command.

torch is pinned to the CPU wheel that lies on this machine's disk (a bare `torch` would pull a
multi-GB CUDA build); the packages themselves declare `torch>=2.11`.
"""

from __future__ import annotations

import glob
import os

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

PYTHON = os.environ.get("KILN_NOX_PYTHON", "3.11")
TORCH = os.environ.get("KILN_TORCH_SPEC", "torch==2.13.0")
TEST_DEPS = ["pytest", "pytest-timeout", "sympy", "numpy", "expecttest"]
# Real models for tests-integration and benchmarks (timm pulls torchvision: docs/testing.md).
MODEL_DEPS = ["timm", "transformers"]
# Keeps every later install from replacing the pinned torch.
CONSTRAINTS = ["-c", "constraints-cpu.txt"] if TORCH == "torch==2.13.0" else []

# package folder -> the kiln packages it depends on (mirrors each pyproject.toml)
PACKAGES: dict[str, list[str]] = {
    "frontend": [],
    "aotgrad": [],
    "loopir": [],
    "runtime": [],
    "codegen-cpp": ["loopir", "runtime", "aotgrad"],
    "codegen-triton": ["loopir", "runtime", "aotgrad"],
    "kiln": ["frontend", "aotgrad", "loopir", "runtime", "codegen-cpp", "codegen-triton"],
}
# Triton from the registry (CPU machines run its kernels under TRITON_INTERPRET=1); a
# session whose packages include codegen-triton installs it.
TRITON = os.environ.get("KILN_TRITON_SPEC", "triton")


def _install(session: nox.Session, *folders: str, extra: tuple[str, ...] = ()) -> None:
    if "codegen-triton" in folders:
        extra = (*extra, TRITON)
    session.install(*CONSTRAINTS, TORCH, *TEST_DEPS, *extra)
    paths = [f"./packages/{f}" for f in folders]
    # --no-deps for our own packages would hide a missing declaration; install them together so
    # pip resolves kiln-* names against the local folders.
    session.install(*CONSTRAINTS, *paths)


def _closure(folder: str) -> list[str]:
    seen: list[str] = []

    def visit(f: str) -> None:
        for dep in PACKAGES[f]:
            visit(dep)
        if f not in seen:
            seen.append(f)

    visit(folder)
    return seen


def _package_session(folder: str):
    def run(session: nox.Session) -> None:
        _install(session, *_closure(folder))
        session.chdir(f"packages/{folder}")
        session.run("pytest", "-q", "tests", *session.posargs)

    run.__doc__ = f"Test kiln's {folder} package with only its declared dependencies installed."
    return run


for _folder in PACKAGES:
    nox.session(python=PYTHON, name=_folder.replace("-", "_"))(_package_session(_folder))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Each package's own session, then tests-integration (the README's test command).

    Each package's tests run with only it and its declared kiln dependencies installed (an
    undeclared import fails); tests-integration runs against one full install."""
    for folder in PACKAGES:
        session.notify(folder.replace("-", "_"), posargs=session.posargs)
    session.notify("integration", posargs=session.posargs)


@nox.session(python=PYTHON)
def integration(session: nox.Session) -> None:
    """tests-integration alone, against one full install (`tests` runs it last)."""
    _install(session, *PACKAGES, extra=tuple(MODEL_DEPS))
    session.run("pytest", "-q", "-p", "no:cacheprovider", "tests-integration", *session.posargs)


# CPython 3.13 (issue 30): torch for cp313 is the registry's standard Linux wheel, with its
# CUDA runtime packages as dependencies (several GB; .ci/run frees disk for them); it runs on CPU.
def _python_313() -> str:
    """pyenv's 3.13 where there is one (these machines install 3.13.0 under pyenv, whose
    ``python3.13`` shim on PATH fails unless 3.13 is a selected pyenv version), else
    ``python3.13`` from PATH; ``KILN_NOX_PYTHON_313`` overrides both."""
    if os.environ.get("KILN_NOX_PYTHON_313"):
        return os.environ["KILN_NOX_PYTHON_313"]
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13")))
    return found[-1] if found else "3.13"


PYTHON_313 = _python_313()
#: what tests_py313 runs: the frontend suite (the soundness modules are part of it) and the
#: integration tests that capture real models
PY313_TESTS = (
    "packages/frontend/tests",
    "tests-integration/test_capture_models.py",
    "tests-integration/test_capture_encoder_decoder.py",
)


@nox.session(python=PYTHON_313)
def tests_py313(session: nox.Session) -> None:
    """The frontend on CPython 3.13: its suite, the soundness modules and the integration
    capture tests, against one full install (torch from the registry's cp313 wheel)."""
    _install(session, *PACKAGES, extra=tuple(MODEL_DEPS))
    session.run("pytest", "-q", "-p", "no:cacheprovider", *PY313_TESTS, *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Compile the seed examples and a real model, print what happened and how fast."""
    _install(session, *PACKAGES, extra=tuple(MODEL_DEPS))
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python=PYTHON)
def opinfo(session: nox.Session) -> None:
    """The OpInfo sweep (docs/coverage.md): every op_db op, float32 CPU, through
    loopir_interpret, the kiln C++ backend (FX route and through kiln.compile) and inductor
    side by side. Slow (inductor compiles);
    narrow it with e.g. `nox -s opinfo -- --backends loopir_interpret --ops sin,softmax`.
    Results: benchmarks/results/opinfo-*.json / .md."""
    _install(session, *PACKAGES, extra=("expecttest",))
    args = session.posargs or ["--backends", "loopir_interpret,kiln,frontend:kiln,inductor"]
    session.run("python", "tests-integration/opinfo_harness.py", *args)


@nox.session(python=PYTHON)
def bench_cpu(session: nox.Session) -> None:
    """CPU benchmark (docs/benchmarks.md): eager vs torch.compile (inductor) vs kiln on seven
    workloads (`--models`: ten timm/transformers models); table, geomeans and
    benchmarks/results/cpu.png. Pass flags after `--` (`--quick`, `--models`, `--only mlp`)."""
    _install(session, *PACKAGES, extra=(*MODEL_DEPS, "matplotlib", "tqdm"))
    session.run("python", "benchmarks/cpu.py", *session.posargs)


@nox.session(python=PYTHON)
def sweep(session: nox.Session) -> None:
    """Correctness sweep (docs/benchmarks.md): ~50 small timm/transformers models with random
    weights through kiln.compile against eager, inference, training and user patterns; not
    part of `tests`. Pass flags after `--` (`--only resnet18,gpt2`, `--no-train`, `--timeout`).
    Results: benchmarks/results/model-sweep.json / .md."""
    _install(session, *PACKAGES, extra=tuple(MODEL_DEPS))
    session.run("python", "benchmarks/model_sweep.py", *session.posargs)
