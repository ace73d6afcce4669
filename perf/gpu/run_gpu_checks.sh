#!/usr/bin/env bash
# The GPU checks of issue 8, in one command, on a machine with an NVIDIA GPU:
#   bash perf/gpu/run_gpu_checks.sh            # tests + W2/W3 (W3 also at 1e8)
#   QUICK=1 bash perf/gpu/run_gpu_checks.sh    # tests + W2/W3 at 4e6 only
# 1. the CUDA tests (the same ones CI runs in the simulator) on the GPU;
# 2. W2 and W3 against PyTorch CUDA and JAX GPU (whichever are installed), written to
#    perf/results/gpu-<date>.json;
# 3. a minute of differential fuzzing on the GPU (eager and jit on CUDA tensors against
#    eager on the CPU: nbgrad fuzz --executors eager,cuda).
# Needs numba-cuda (pip install -e '.[cuda]'); PyTorch with CUDA and jax[cuda12] for the peers.
set -uo pipefail
cd "$(dirname "$0")/../.."
unset NUMBA_ENABLE_CUDASIM  # the real GPU, not the simulator

python - <<'PY' || { echo "no usable CUDA GPU: nothing to check"; exit 2; }
from numba import cuda
assert cuda.is_available(), "numba.cuda sees no GPU"
d = cuda.get_current_device()
print("GPU:", d.name.decode() if isinstance(d.name, bytes) else d.name,
      "compute capability", d.compute_capability)
PY

status=0
python -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_cuda_jit.py tests/test_cuda_runtime.py \
    tests/test_fuzz_cuda.py tests/test_jit_trust.py tests/test_numpy_interop.py \
    tests/test_jit_verify.py -k "cuda or Cuda" || status=1

stamp=$(date +%Y%m%d-%H%M%S)
mkdir -p perf/results
big="--big"
[ "${QUICK:-0}" = "1" ] && big=""
python perf/gpu/bench_gpu.py $big --json "perf/results/gpu-${stamp}.json" || status=1
echo "results: perf/results/gpu-${stamp}.json"
python -m nbgrad fuzz --minutes "${FUZZ_MINUTES:-1}" --executors eager,cuda --max-steps 6 || status=1
exit $status
