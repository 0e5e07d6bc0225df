#!/usr/bin/env bash
# vLLM on an NVIDIA GPU: colocate and server mode (NCCL weight transfer), a few GRPO steps each on a small model,
# printing engine start, step and weight-push times; then the zero3 preset (gathered and hook-driven generation) and
# the fsdp2 preset (when the machine has 2 GPUs: FSDP needs one process per GPU), and QLoRA (4-bit base, LoRA, vLLM
# colocate: the dequantised base with the adapter merged is pushed, so the logp gap stays small). Meant for a lent GPU machine with no network beyond PyPI:
# it builds its own venv, a random-init Qwen2 model (0.1B-class) and a prompt file locally. About 5-8 minutes.
#   bash benchmarks/gpu_check.sh            # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
WORK=${WORK:-$(mktemp -d)}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

python3 -m venv "$WORK/venv"
. "$WORK/venv/bin/activate"
pip install -q -e ".[vllm,peft,qlora]" "deepspeed>=0.19"
python - <<'PY'
import torch, vllm, transformers
print(f"torch {torch.__version__} (cuda {torch.version.cuda}), vllm {vllm.__version__}, transformers {transformers.__version__}")
PY

# A random-init Qwen2 (hidden 1024, 8 layers, 16 heads) with a word-level tokenizer, and digit prompts.
python - "$WORK" <<'PY'
import json, os, random, sys
from grpokit.tiny import build_word_tokenizer, build_model
work = sys.argv[1]
tok = build_word_tokenizer(vocab_size=32768)
model = build_model(tok, hidden_size=1024, num_layers=8, num_heads=16, vocab_size=len(tok))
model.save_pretrained(f"{work}/model"); tok.save_pretrained(f"{work}/model")
rng = random.Random(0)
with open(f"{work}/prompts.jsonl", "w") as f:
    for _ in range(2000):
        f.write(json.dumps({"prompt": f"{rng.randrange(10)}="}) + "\n")
print("model:", sum(p.numel() for p in model.parameters()) / 1e6, "M parameters")
PY

BASE=(--model_name_or_path "$WORK/model" --dataset_name "$WORK/prompts.jsonl" --reward_funcs grpokit.demo.copy_digit_reward
  --num_generations 8 --per_device_train_batch_size 32 --max_completion_length 64 --max_steps 12 --logging_steps 1
  --learning_rate 1e-5 --bf16 true --report_to none --save_strategy no)
COMMON=("${BASE[@]}" --beta 0.0 --use_vllm true)

report() {  # the step times and weight-push times a run logged
  python - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
steps = [r["step_time"] for r in rows if "step_time" in r][2:]
syncs = [r["timing/vllm_weight_sync"] for r in rows if "timing/vllm_weight_sync" in r][1:]
gap = [r["sampling/sampling_logp_difference/mean"] for r in rows if "sampling/sampling_logp_difference/mean" in r]
line = f"  median step {statistics.median(steps):.3f} s"
if syncs:
    line += f", median weight push {statistics.median(syncs):.3f} s, logp gap mean {statistics.mean(gap):.2e}"
print(line + f", reward {rows[-1].get('reward', float('nan')):.3f} at step {rows[-1].get('step')}")
PY
}

echo "== colocate"
start=$(date +%s)
grpokit train "${COMMON[@]}" --vllm_mode colocate --vllm_gpu_memory_utilization 0.3 --output_dir "$WORK/colocate" \
  > "$WORK/colocate.log" 2>&1 || { tail -30 "$WORK/colocate.log"; exit 1; }
echo "  wall $(( $(date +%s) - start )) s (engine start included)"
report "$WORK/colocate"

echo "== QLoRA: nf4 base, LoRA r 16 on all linear layers, beta 0.04, vLLM colocate"
grpokit train "${BASE[@]}" --use_vllm true --beta 0.04 --use_peft true --lora_r 16 --lora_target_modules all-linear \
  --load_in_4bit true --dtype bfloat16 --learning_rate 1e-4 --vllm_mode colocate --vllm_gpu_memory_utilization 0.3 \
  --output_dir "$WORK/qlora" > "$WORK/qlora.log" 2>&1 || { tail -30 "$WORK/qlora.log"; exit 1; }
report "$WORK/qlora"
python - "$WORK/qlora" <<'PY'
import os, sys
files = set(os.listdir(sys.argv[1]))
assert {"adapter_model.safetensors", "adapter_config.json"} <= files and "model.safetensors" not in files, files
print("  saved the adapter only:", sorted(f for f in files if f.startswith("adapter")))
PY

echo "== server (NCCL weight transfer)"
start=$(date +%s)
CUDA_VISIBLE_DEVICES=0 grpokit vllm-serve "$WORK/model" --port 8011 --gpu-memory-utilization 0.3 > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
until curl -sf http://127.0.0.1:8011/health > /dev/null; do
  kill -0 $SERVER 2>/dev/null || { tail -30 "$WORK/server.log"; exit 1; }
  sleep 2
done
echo "  server healthy after $(( $(date +%s) - start )) s"
grpokit train "${COMMON[@]}" --vllm_mode server --vllm_server_port 8011 --output_dir "$WORK/server" \
  > "$WORK/server-train.log" 2>&1 || { tail -30 "$WORK/server-train.log"; exit 1; }
report "$WORK/server"
kill $SERVER 2>/dev/null || true

# Sharded engines, beta > 0 (a reference model sharded like the policy).
for gather in true false; do
  echo "== zero3, 1 process, ds3_gather_for_generation=$gather"
  start=$(date +%s)
  grpokit train "${BASE[@]}" --beta 0.04 --accelerate_config zero3 --num_processes 1 \
    --ds3_gather_for_generation $gather --output_dir "$WORK/zero3-$gather" > "$WORK/zero3-$gather.log" 2>&1 \
    || { tail -30 "$WORK/zero3-$gather.log"; exit 1; }
  echo "  wall $(( $(date +%s) - start )) s"
  report "$WORK/zero3-$gather"
done
GPUS=$(nvidia-smi --list-gpus | wc -l)
if [ "$GPUS" -ge 2 ]; then
  for preset in zero3 fsdp2; do
    echo "== $preset, 2 processes"
    grpokit train "${BASE[@]}" --beta 0.04 --accelerate_config $preset --num_processes 2 \
      --output_dir "$WORK/$preset-2" > "$WORK/$preset-2.log" 2>&1 || { tail -30 "$WORK/$preset-2.log"; exit 1; }
    report "$WORK/$preset-2"
  done
else
  echo "== fsdp2: not run ($GPUS GPU; accelerate uses FSDP only with several GPU processes)"
fi
echo "logs and runs in $WORK"
