"""LoRA adapter-only weight sync to a vLLM server: the adapter goes over, never the base weights.

A PEFT LoRA policy trained against a server started with `--enable-lora` (`grpokit vllm-serve MODEL --enable-lora
--max-lora-rank R --max-loras N` also sets `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`, which mounts
`/v1/load_lora_adapter`) is synced by writing its adapter to a folder the server reads and loading it there under a
new name per version, `grpokit-<run>-v<version>`; generation then names that adapter as the request's model. A new
name per version, not an in-place reload: vLLM caches prefixes per adapter name, so a reused name could serve the
previous policy's cached keys and values. The `keep` newest adapters stay loaded (requests in flight still name
them), older ones are unloaded and their folders removed one sync later (vLLM resolves an adapter's folder lazily).
`<run>` is random per trainer process, so a resumed or restarted run never reloads a name a running server already
holds (the version itself carries on from the checkpoint).

Where the adapter cannot be served (anything vLLM's adapter format cannot hold: several active adapters, another
PEFT type, DoRA, trained biases, `modules_to_save`, adapters on the head or the embeddings; a server without
`--enable-lora`, or whose `--max-lora-rank` / `--max-loras` are too small), `adapter_problem` says why in one line and
the caller pushes merged weights instead. The folder must be one the server can read: the same machine, or a shared
filesystem.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections import deque

# Ranks vLLM builds LoRA buffers for (its `max_lora_rank` choices).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Modules vLLM does not apply LoRA to through a plain adapter.
_UNSERVED_TARGETS = ("lm_head", "embed_tokens", "wte", "embed_in", "embed_out")


def served_rank(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that serves an adapter of `rank`.

    >>> served_rank(4), served_rank(8), served_rank(9)
    (8, 8, 16)
    """
    for choice in VLLM_LORA_RANKS:
        if choice >= rank:
            return choice
    raise ValueError(f"LoRA rank {rank} is above the largest rank vLLM serves ({VLLM_LORA_RANKS[-1]})")


def adapter_rank(config) -> int:
    """The largest rank of a `LoraConfig` (its `r` and `rank_pattern`)."""
    return max([int(config.r), *(int(r) for r in (getattr(config, "rank_pattern", None) or {}).values())])


def adapter_problem(model) -> str | None:
    """Why `model`'s active adapter cannot be served by vLLM as a LoRA adapter, or None when it can."""
    from grpokit.models import is_peft_model

    if not is_peft_model(model):
        return "the policy has no PEFT adapter"
    active = list(getattr(model, "active_adapters", None) or [model.active_adapter])
    if len(active) != 1:
        return f"{len(active)} adapters are active ({', '.join(active)}); vLLM serves one"
    config = model.peft_config[active[0]]
    kind = type(config).__name__
    if kind != "LoraConfig":
        return f"the adapter is a {kind}, not a LoRA adapter"
    if getattr(config, "use_dora", False):
        return "DoRA's magnitude vectors have no place in a vLLM LoRA adapter"
    if getattr(config, "bias", "none") != "none":
        return f"bias={config.bias!r} trains biases, which a vLLM LoRA adapter does not carry"
    if getattr(config, "modules_to_save", None):
        return (
            f"modules_to_save={list(config.modules_to_save)} are trained whole, which a vLLM LoRA adapter cannot carry"
        )
    if getattr(config, "target_parameters", None):
        return "target_parameters (LoRA on parameters, e.g. fused MoE experts) is not served as a plain adapter"
    targets = config.target_modules
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    unserved = [t for t in targets if any(name in str(t) for name in _UNSERVED_TARGETS)]
    if unserved:
        return f"the adapter targets {unserved}: vLLM applies LoRA to the decoder's linear layers only"
    return None


def server_problem(lora_config: dict | None, rank: int, adapters_needed: int) -> str | None:
    """Why a server with `lora_config` (its `/server_info`'s, None without `--enable-lora`) cannot hold
    `adapters_needed` adapters of `rank` at once, or None."""
    if not lora_config:
        return (
            f"the vLLM server was started without --enable-lora (start it with `grpokit vllm-serve MODEL --enable-lora "
            f"--max-lora-rank {served_rank(rank)} --max-loras {adapters_needed}` to push the adapter alone)"
        )
    max_rank = int(lora_config.get("max_lora_rank") or 0)
    if max_rank < rank:
        return f"the vLLM server's --max-lora-rank is {max_rank}, below the adapter's rank {rank} (use {served_rank(rank)})"
    slots = int(lora_config.get("max_loras") or 0)
    if slots < adapters_needed:
        return (
            f"the vLLM server's --max-loras is {slots}; requests in flight may name {adapters_needed} adapter versions "
            f"at once (max_staleness + 2)"
        )
    return None


def save_adapter(model, folder: str) -> int:
    """Write `model`'s active adapter to `folder` (`adapter_config.json` at its root, as vLLM reads it), through a
    hidden sibling renamed into place, so the server never sees half a folder; returns the weights' bytes."""
    name = model.active_adapter
    staging = os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, selected_adapters=[name], safe_serialization=True)
    saved = staging if name == "default" else os.path.join(staging, name)  # PEFT nests the other adapters
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(saved, folder)
    shutil.rmtree(staging, ignore_errors=True)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))


class AdapterVersions:
    """The adapters one trainer process loads into a server: names, folders, and which to unload.

    `request(path, body)` is the server's JSON POST. `keep`: how many newest versions stay loaded."""

    def __init__(self, request, root: str, keep: int):
        self.request, self.root, self.keep = request, root, max(int(keep), 1)
        self.run = secrets.token_hex(4)
        self.version = 0  # the last version loaded (a resumed trainer sets where it carries on from)
        self.loaded: deque[str] = deque()
        self._removable: list[str] = []  # folders of unloaded adapters, removed at the next push
        self.last_bytes = 0

    def name(self, version: int) -> str:
        return f"grpokit-{self.run}-v{version}"

    @property
    def current(self) -> str | None:
        return self.loaded[-1] if self.loaded else None

    def push(self, model) -> str:
        """Save and load the next version; unload those beyond `keep`. Returns its name."""
        for folder in self._removable:
            shutil.rmtree(folder, ignore_errors=True)
        self._removable = []
        self.version += 1
        name = self.name(self.version)
        folder = os.path.join(self.root, name)
        os.makedirs(self.root, exist_ok=True)
        self.last_bytes = save_adapter(model, folder)
        self.request("/v1/load_lora_adapter", {"lora_name": name, "lora_path": folder, "load_inplace": False})
        self.loaded.append(name)
        while len(self.loaded) > self.keep:
            old = self.loaded.popleft()
            self.request("/v1/unload_lora_adapter", {"lora_name": old})
            self._removable.append(os.path.join(self.root, old))
        return name
