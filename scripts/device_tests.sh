#!/usr/bin/env bash
# Set up the lent GPU machine from the carried working tree and run the tests that need it.
# That machine has Python 3.12, torch 2.11, triton, pytest, timm and transformers, and no
# network, so nothing is installed: the frontend's C extension is built in place and every
# package is put on PYTHONPATH. Usage (from the repo root, on that machine):
#     bash scripts/device_tests.sh [frontend|all] [pytest args...]
#     bash scripts/device_tests.sh bench_gpu [benchmarks/gpu.py args...]   # results in $OUT
#     bash scripts/device_tests.sh bench_runtime   # CUDA graphs (benchmarks/gpu_runtime.py)
#     bash scripts/device_tests.sh bench_models [benchmarks/gpu_models.py args...]   # 21-model suite
#     bash scripts/device_tests.sh bench_quantized # int8 weight-only GEMMs (benchmarks/quantized_gpu.py)
#     bash scripts/device_tests.sh bench_flex [args] # FlexAttention (benchmarks/flex_attention_gpu.py)
#     bash scripts/device_tests.sh bench_distributed # DDP, FSDP2, TP on 2 GPUs (x2 kind)
#     bash scripts/device_tests.sh bench_checkpoint # GPT-2 with activation checkpointing
#     bash scripts/device_tests.sh bench_regional [args] # regional compilation (benchmarks/regional.py)
#     bash scripts/device_tests.sh bench_train     # a training step (benchmarks/train.py)
#     bash scripts/device_tests.sh bench_ddp       # DDP, 2 GPUs, NCCL (benchmarks/ddp.py; x2 kind)
#     bash scripts/device_tests.sh profile         # kernel-by-kernel GPU time, kiln vs torch.compile
#         (experiments/gpu-kernel-profile/gpu_profile.py)
#     bash scripts/device_tests.sh cold_profile    # where a cold compile goes (cProfile;
#         experiments/cold-compile-profile/cold_profile.py)
#     bash scripts/device_tests.sh cuda            # the tests marked cuda
#     bash scripts/device_tests.sh experiment experiments/<topic>/<script>.py [args]   # one experiment
#     bash scripts/device_tests.sh sweep [benchmarks/model_sweep.py args...]   # results in $OUT
#         (the correctness sweep on CUDA, e.g. `sweep --no-patterns --budget 480 --timeout 120`)
# (bench_gpu: the OpInfo sweep on CUDA, cos+sin and softmax/layernorm against copy bandwidth,
# fp16 models against torch.compile.)
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-frontend}"; shift || true
python3 --version
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
python3 packages/frontend/hatch_build.py --inplace
# kiln's backends and codegens are found through entry points: write them as pip would have
export PYTHONPATH="$(python3 scripts/entry_points.py):$(ls -d "$PWD"/packages/*/src | tr '\n' ':')${PYTHONPATH:-}"
export KILN_CACHE_DIR="${KILN_CACHE_DIR:-/tmp/kiln-cache}"
case "$what" in
  frontend) python3 -m pytest -q -p no:cacheprovider packages/frontend/tests "$@" ;;
  all) python3 -m pytest -q -p no:cacheprovider packages/*/tests "$@" ;;
  bench_gpu) python3 -u benchmarks/gpu.py "$@" ;;
  bench_runtime) python3 -u benchmarks/gpu_runtime.py "$@" ;;
  bench_models) python3 -u benchmarks/gpu_models.py "$@" ;;
  bench_quantized) python3 -u benchmarks/quantized_gpu.py "$@" ;;
  bench_flex) python3 -u benchmarks/flex_attention_gpu.py "$@" ;;
  bench_distributed) python3 -u benchmarks/distributed.py "$@" ;;
  bench_checkpoint) python3 -u benchmarks/checkpoint_gpu.py "$@" ;;
  bench_regional) python3 -u benchmarks/regional.py --device cuda "$@" ;;
  bench_train) python3 -u benchmarks/train.py --device cuda "$@" ;;
  bench_ddp) python3 -u benchmarks/ddp.py --device cuda "$@" ;;
  profile) python3 -u experiments/gpu-kernel-profile/gpu_profile.py "$@" ;;
  cold_profile) python3 -u experiments/cold-compile-profile/cold_profile.py "$@" ;;
  sweep) python3 -u benchmarks/model_sweep.py --device cuda "$@" ;;
  experiment) python3 -u "$@" ;;
  # the tests marked cuda (codegen-triton's suite is left out: its conftest turns the Triton
  # interpreter on for the whole session)
  cuda) python3 -m pytest -q -p no:cacheprovider -m cuda $(ls -d packages/*/tests | grep -v codegen-triton) "$@" ;;
  *) echo "unknown target $what (frontend|all|cuda|bench_gpu|bench_runtime|bench_models|bench_quantized|bench_flex|bench_distributed|bench_checkpoint|bench_regional|bench_train|bench_ddp|profile|cold_profile|sweep|experiment)" >&2; exit 2 ;;
esac
