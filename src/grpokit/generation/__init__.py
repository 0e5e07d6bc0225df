"""Generation backends behind one small interface (`base.GenerationBackend`).

- `transformers_backend.TransformersGenerator`: transformers' `generate`, through grpokit's decoding loop
  (`decoding.py`) where it applies.
- `vllm_colocate.VLLMColocateGenerator` and `vllm_server.VLLMServerGenerator`: vLLM in the training process or in a
  `vllm serve` process. vLLM is imported only inside the `vllm_*` modules, so importing this package never loads it.

`factory.build_generator` chooses and builds the backend a `GRPOConfig` asks for; `push.WeightPushes` decides when a
vLLM engine gets the policy's weights. `tokens.py` holds what every backend shares: prompt encoding, padding, EOS
handling, decoding to text; `vllm_common.py` what the vLLM backends share.
"""

from .base import Generated, GenerationBackend, GenerationError
from .factory import build_generator
from .tokens import (
    check_prompt_lengths,
    cut_after_eos,
    decode_completions,
    encode_prompts,
    is_conversational,
    is_truncated,
    left_truncate,
    pad,
)
from .transformers_backend import TransformersGenerator

__all__ = [
    "GenerationBackend",
    "Generated",
    "GenerationError",
    "TransformersGenerator",
    "build_generator",
    "check_prompt_lengths",
    "cut_after_eos",
    "decode_completions",
    "encode_prompts",
    "is_conversational",
    "is_truncated",
    "left_truncate",
    "pad",
]
