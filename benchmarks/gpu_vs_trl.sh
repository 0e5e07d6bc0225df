#!/usr/bin/env bash
# grpokit against TRL 1.16 on one CUDA GPU (H200-class), side by side on the same workload, bf16: transformers
# generation and vLLM colocate. Prints step time, phases, tokens/s, peak GPU memory, MFU of the training phase and
# the ratios (see benchmarks/gpu_vs_trl.py for what each number is). For a lent GPU machine with no network beyond
# PyPI: builds its own venv (grpokit from this checkout with its vLLM extra, trl==1.16.0), a random-init 0.5B-class
# Qwen2 and prompts locally, and SmolLM2-135M's shape with random weights for the real-shape legs
# (GPU_VS_TRL_LEGS=smollm2-6,smollm2-128 runs only those: about 5 minutes with the install). About 16 minutes: ~2-3 to install, ~5 for the four runs (each stopped at 150 s), ~6 for the five asynchronous
# legs against a vLLM server (benchmarks/gpu_async_vs_trl.py, each stopped at 90 s; also one device call on its own).
#   bash benchmarks/gpu_vs_trl.sh                  # from anywhere in the checkout
#   PYTHON=/path/to/python bash benchmarks/gpu_vs_trl.sh   # an interpreter that has them already: no venv built
# Without CUDA it stops, after preparing everything it can, with one line saying so (exit 3).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
WORK=${WORK:-$(mktemp -d)}
die() { echo "gpu_vs_trl: $*" >&2; exit 2; }
[ -f pyproject.toml ] && [ -d src/grpokit ] || die "run it from a grpokit checkout (no pyproject.toml / src/grpokit here)"
start=$(date +%s)

if [ -z "${PYTHON:-}" ]; then
  command -v python3 > /dev/null || die "python3 is not installed"
  python3 -m venv "$WORK/venv" || die "python3 -m venv failed (install the python3-venv package)"
  "$WORK/venv/bin/pip" install -q --upgrade pip > /dev/null || die "pip cannot reach PyPI (see above)"
  "$WORK/venv/bin/pip" install -q -e ".[vllm]" "trl==1.16.0" aiohttp requests || die "pip install of grpokit[vllm] and trl==1.16.0 failed (see above)"
  PYTHON="$WORK/venv/bin/python"
  echo "venv built in $(( $(date +%s) - start )) s: $WORK/venv"
fi
[ -x "$(command -v "$PYTHON")" ] || die "PYTHON=$PYTHON is not an executable"

"$PYTHON" - <<'PY' || die "the environment is incomplete (the line above says what is missing)"
import importlib.util, os, sys
missing = [m for m in ("torch", "transformers", "datasets", "trl", "vllm", "grpokit") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_vs_trl: missing in {sys.executable}: {', '.join(missing)}")
import grpokit, torch, transformers, trl, vllm
if trl.__version__ != "1.16.0":
    sys.exit(f"gpu_vs_trl: trl {trl.__version__} installed; this comparison is against trl 1.16.0")
here = os.path.realpath("src/grpokit")
if os.path.realpath(os.path.dirname(grpokit.__file__)) != here:
    sys.exit(f"gpu_vs_trl: grpokit imports from {os.path.dirname(grpokit.__file__)}, not this checkout ({here})")
print(f"torch {torch.__version__} (cuda {torch.version.cuda}), transformers {transformers.__version__}, "
      f"trl {trl.__version__}, vllm {vllm.__version__}, grpokit from {here}")
PY

"$PYTHON" benchmarks/gpu_vs_trl.py prepare --work "$WORK" || die "building the model and prompts failed"

if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_vs_trl: no CUDA GPU here (torch.cuda.is_available() is False): environment, model and prompts are ready in $WORK; the runs need a GPU"
  exit 3
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null || true
GPU_VS_TRL_RUN_TIMEOUT=${GPU_VS_TRL_RUN_TIMEOUT:-150} timeout 900 "$PYTHON" benchmarks/gpu_vs_trl.py run --work "$WORK"
# The asynchronous legs: grpokit sync, grpokit async (max_staleness 0, 1, 4) and TRL 1.16's async trainer against one
# vLLM server on this GPU.
GPU_VS_TRL_RUN_TIMEOUT=${GPU_VS_TRL_ASYNC_RUN_TIMEOUT:-90} timeout 900 "$PYTHON" benchmarks/gpu_async_vs_trl.py run --work "$WORK" \
  || echo "gpu_vs_trl: the asynchronous legs stopped (see above)"
echo "total $(( $(date +%s) - start )) s; runs and logs in $WORK"
