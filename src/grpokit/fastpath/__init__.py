"""CPU fast paths for Llama-family models (Llama, Qwen2): plain tensor code that computes what the model's own
forward computes, faster on a CPU.

- `column_step.py`: one decode step as a short run of tensor operations (used by `generation.decoding`);
- `kv_cache.py`: preallocated per-row KV buffers and prompts kept once per group while decoding;
- `prefix_attention.py`: one-pass shared-prefix scoring, attention reading each prompt once per group (used by
  `scoring.prefix`);
- `few_rows.py` (with `few_rows.c`): float32 kernels for the decode step's few rows (products, the gated MLP's first
  half, RMSNorm), built once with the C compiler at hand (x86-64 with AVX-512F; torch's operations elsewhere);
- `allocator.py`: freed memory kept for reuse instead of faulted in again every step (used by the trainer on CPU);
- `cpu.py`: whether this CPU multiplies bfloat16 in hardware.

Each path checks that it can follow the model exactly and steps aside otherwise (other architectures, hooks, PEFT
layers where they matter, sharded parameters, non-CPU devices).
"""

from .allocator import keep_freed_memory

__all__ = ["keep_freed_memory"]
