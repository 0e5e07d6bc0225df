"""What a Tinker request does to the model: one base model, a LoRA adapter (PEFT) and an AdamW per training client,
sampler snapshots of those adapters, and the four operations: forward(_backward), optim_step, save/load, sample.

Everything here is synchronous torch work; the server (`app.py`) runs it on one worker thread, one request at a time,
so two clients' requests never interleave inside one operation. Gradients live on each adapter's own parameters, so
client A's accumulated gradient is untouched by client B's `forward_backward` until A's `optim_step`.

Sampling reports, for each sampled token, its log-probability under the model's untempered distribution (temperature
1, no top-k/top-p), computed by the same forward pass that `forward` uses: so the sampler's and the learner's
log-probabilities of the same tokens under the same weights agree to float rounding, whatever the temperature.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from grpokit.algorithms.logprobs import token_logps_and_entropy
from grpokit.generation.tokens import pad

from .losses import LossInputError, check, tinker_loss

logger = logging.getLogger(__name__)

LORA_ALPHA = 32  # Tinker's LoRA scale: alpha / rank with alpha fixed at 32, whatever the rank
SAMPLER_SLOTS = 4  # sampler snapshots kept loaded as adapters at once (least recently used dropped)
EPHEMERAL_KEPT = 8  # unnamed sampler snapshots kept per training client (the newest)
TOKENS_PER_MICROBATCH = 8192  # forward_backward runs its data in pieces of at most this many padded tokens


class UserError(ValueError):
    """A request that cannot be served as sent (bad ids, lengths, names, unknown models): one line, the client's
    fault; the server keeps serving."""


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


@dataclasses.dataclass
class Datum:
    tokens: list[int]
    inputs: dict[str, Tensor]  # loss_fn_inputs by name, flat float32 / int64 tensors of len(tokens)


@dataclasses.dataclass
class SampleOut:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" or "length"
    topk: tuple[Tensor, Tensor] | None = None  # (ids, logprobs), each (len(tokens), k)


@dataclasses.dataclass
class SampleResult:
    sequences: list[SampleOut]
    prompt_logprobs: Tensor | None = None  # (P,) float32, NaN at position 0 (and before prompt_logprobs_last_n)
    topk_prompt: tuple[Tensor, Tensor] | None = None  # (P, k) ids and logprobs


@dataclasses.dataclass
class _Trained:
    adapter: str
    spec: LoraSpec
    optimizer: torch.optim.Optimizer | None = None
    steps: int = 0
    ephemeral: list[str] = dataclasses.field(default_factory=list)


class Engine:
    """The model side of a Tinker server over one base model.

    Args:
        source: a local folder, a GGUF file (converted once into grpokit's cache) or a Hub id.
        state_dir: where `save_state` / `save_weights_for_sampler` write (`tinker://` paths map below it).
        dtype: the base weights' dtype (default: float32 on CPU, bfloat16 on CUDA); adapters train in float32.
        device: where the model runs (default: CUDA when there is one, else CPU).
    """

    def __init__(self, source: str, state_dir: str, *, dtype: torch.dtype | None = None, device: str | None = None):
        from grpokit import gguf, models

        if source.endswith(".gguf") and os.path.isfile(source):
            folder = os.path.join(gguf.cache_dir(), os.path.splitext(os.path.basename(source))[0])
            if not os.path.isfile(os.path.join(folder, "config.json")):
                gguf.convert(source, folder)
            source = folder
        self.source = source
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tokenizer = models.load_tokenizer(source)
        self.model = models.load_policy(source, {"dtype": dtype}, trust_remote_code=False).to(self.device)
        self.model.eval()  # no dropout: sampler and learner compute the same function
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.vocab_size = self.model.get_output_embeddings().weight.size(0)
        self.max_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        self.name = self.model.config._name_or_path or source
        self._linears = _linear_parts(self.model)  # (module name, "attn" | "mlp" | "unembed" | "other"), before PEFT
        self.state_dir = state_dir
        os.makedirs(state_dir, exist_ok=True)
        self.peft = None  # the PeftModel over `model`, made with the first training client
        self.trained: dict[str, _Trained] = {}
        self.snapshots: dict[str, tuple[LoraSpec, dict[str, Tensor]]] = {}  # sampler path -> adapter weights
        self._slots: OrderedDict[str, str] = OrderedDict()  # sampler path -> adapter name, most recent last
        self._adapter_count = 0

    # ----------------------------------------------------------------------------------------------------------------
    # Names
    # ----------------------------------------------------------------------------------------------------------------

    def matches(self, base_model: str | None) -> bool:
        """Whether a client's `base_model` names this server's model: its path as given or absolute, or the same last
        path component (`HuggingFaceTB/SmolLM2-135M-Instruct` names a folder `.../SmolLM2-135M-Instruct`)."""
        if not base_model:
            return False
        names = {self.source, os.path.abspath(self.source), self.name}
        tails = {os.path.basename(os.path.normpath(n)) for n in names}
        return base_model in names or os.path.basename(os.path.normpath(base_model)) in tails

    # ----------------------------------------------------------------------------------------------------------------
    # Training clients
    # ----------------------------------------------------------------------------------------------------------------

    def create_model(self, model_id: str, spec: LoraSpec) -> None:
        if spec.rank < 1:
            raise UserError(f"lora rank must be >= 1, got {spec.rank}")
        if model_id in self.trained:
            raise UserError(f"model {model_id} exists already")
        adapter = self._add_adapter(spec)
        self.trained[model_id] = _Trained(adapter, spec)

    def _targets(self, spec: LoraSpec) -> list[str]:
        wanted = {"unembed": spec.train_unembed, "attn": spec.train_attn, "mlp": spec.train_mlp}
        targets = [name for name, part in self._linears if wanted.get(part)]
        if not targets:
            raise UserError("train_mlp, train_attn and train_unembed select no linear layer of this model")
        return targets

    def _add_adapter(self, spec: LoraSpec) -> str:
        from peft import LoraConfig, get_peft_model

        self._adapter_count += 1
        name = f"a{self._adapter_count}"
        config = LoraConfig(
            r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=self._targets(spec), bias="none"
        )
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            if spec.seed is not None:
                torch.manual_seed(spec.seed)
            if self.peft is None:
                self.peft = get_peft_model(self.model, config, adapter_name=name)
                self.peft.eval()
            else:
                self.peft.add_adapter(name, config)
        for pname, param in self.peft.named_parameters():  # adapters train in float32 whatever the base's dtype
            if f".{name}." in pname:
                param.data = param.data.float()
        return name

    def _adapter_params(self, adapter: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.peft.named_parameters() if f".{adapter}." in n]

    def _get(self, model_id: str) -> _Trained:
        if model_id not in self.trained:
            raise UserError(f"unknown model_id {model_id!r}: create it first (create_lora_training_client)")
        return self.trained[model_id]

    # ----------------------------------------------------------------------------------------------------------------
    # forward / forward_backward / optim_step
    # ----------------------------------------------------------------------------------------------------------------

    def check_tokens(self, tokens: Sequence[int], what: str) -> None:
        if not tokens:
            raise UserError(f"{what} is empty")
        bad = next((t for t in tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise UserError(f"{what} has token id {bad}, outside the vocabulary [0, {self.vocab_size})")
        if self.max_length is not None and len(tokens) > self.max_length:
            raise UserError(f"{what} has {len(tokens)} tokens, over the model's {self.max_length}")

    def forward_backward(
        self, model_id: str, data: Sequence[Datum], loss_fn: str, config: Mapping[str, float], *, backward: bool
    ) -> tuple[list[Tensor], dict[str, float]]:
        """Per-datum log-probabilities of `target_tokens` and the metrics (`loss:sum`); with `backward`, the loss's
        gradient is added to the adapter's parameters (kept until `optim_step`)."""
        trained = self._get(model_id)
        for i, datum in enumerate(data):
            self.check_tokens(datum.tokens, f"datum {i}'s model_input")
            for name, value in datum.inputs.items():
                if value.numel() != len(datum.tokens):
                    raise UserError(
                        f"datum {i}: loss_fn_inputs[{name!r}] has {value.numel()} values for {len(datum.tokens)} "
                        "input tokens (they must be equal)"
                    )
            if "target_tokens" in datum.inputs:
                self.check_tokens(datum.inputs["target_tokens"].tolist(), f"datum {i}'s target_tokens")
            try:
                check(loss_fn, set(datum.inputs), config)
            except LossInputError as e:
                raise UserError(f"datum {i}: {e}") from None
        self.peft.set_adapter(trained.adapter)
        params = self._adapter_params(trained.adapter)
        for param in params:
            param.requires_grad_(backward)
        logps_out: list[Tensor] = []
        total = 0.0
        for piece in _microbatches(data):
            with torch.set_grad_enabled(backward):
                logps = self._logps([d.tokens for d in piece], [d.inputs["target_tokens"] for d in piece])
                losses = [
                    tinker_loss(loss_fn, lp, {k: v.to(self.device) for k, v in d.inputs.items()}, config)
                    for lp, d in zip(logps, piece, strict=True)
                ]
                loss = torch.stack(losses).sum()
                if backward:
                    loss.backward()
            total += float(loss.detach())
            logps_out.extend(lp.detach().float().cpu() for lp in logps)
        return logps_out, {"loss:sum": total}

    def _logits(self, model, rows: Sequence[Sequence[int]]) -> Tensor:
        """`(B, T, V)` logits of the right-padded rows (padding masked out)."""
        ids = pad(rows, value=0, side="right").to(self.device)
        mask = pad([[1] * len(r) for r in rows], value=0, side="right").to(self.device)
        return model(input_ids=ids, attention_mask=mask).logits

    def _logps(self, rows: Sequence[Sequence[int]], targets: Sequence[Tensor]) -> list[Tensor]:
        """Log-probabilities (temperature 1, float32) of `targets[i][t]` after `rows[i][: t + 1]`: one forward pass
        over the right-padded rows under the active adapter."""
        labels = pad([t.tolist() for t in targets], value=0, side="right").to(self.device)
        logits = self._logits(self.peft if self.peft is not None else self.model, rows)
        logps, _ = token_logps_and_entropy(logits, labels, compute_entropy=False)
        return [logps[i, : len(row)] for i, row in enumerate(rows)]

    def optim_step(
        self,
        model_id: str,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        grad_clip_norm: float,
    ) -> dict[str, float]:
        trained = self._get(model_id)
        params = self._adapter_params(trained.adapter)
        if trained.optimizer is None:
            trained.optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        for group in trained.optimizer.param_groups:
            group.update(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        # The global norm before clipping (clip_grad_norm_ measures it; an infinite bound clips nothing).
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip_norm if grad_clip_norm > 0 else math.inf)
        trained.optimizer.step()
        trained.optimizer.zero_grad(set_to_none=True)
        trained.steps += 1
        return {"grad_norm:mean": float(norm)}

    # ----------------------------------------------------------------------------------------------------------------
    # Checkpoints: tinker://<model_id>/weights/<name> (adapter + optimizer), .../sampler_weights/<name> (adapter)
    # ----------------------------------------------------------------------------------------------------------------

    def _folder(self, path: str) -> str:
        if not path.startswith("tinker://"):
            raise UserError(f"path {path!r} is not a tinker:// path")
        rest = path[len("tinker://") :]
        parts = rest.split("/")
        if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") or not all(parts):
            raise UserError(f"path {path!r}: expected tinker://<model_id>/weights|sampler_weights/<name>")
        if any(p in (".", "..") or os.sep in p for p in parts):
            raise UserError(f"path {path!r} has a path component that is not a plain name")
        return os.path.join(self.state_dir, parts[0].replace(":", "_"), parts[1], parts[2])

    def _adapter_state(self, adapter: str) -> dict[str, Tensor]:
        return {n: p.detach().float().cpu().clone() for n, p in self.peft.named_parameters() if f".{adapter}." in n}

    def save(self, model_id: str, name: str, *, kind: str, overwrite: bool = True) -> str:
        """Write the adapter (and with kind "weights" the optimizer) under a tinker:// path; return the path. An
        existing checkpoint of that name is replaced only with `overwrite`."""
        from safetensors.torch import save_file

        trained = self._get(model_id)
        if not name or "/" in name or name in (".", ".."):
            raise UserError(f"checkpoint name {name!r} must be a plain non-empty name")
        path = f"tinker://{model_id}/{kind}/{name}"
        folder = self._folder(path)
        if not overwrite and os.path.isfile(os.path.join(folder, "meta.json")):
            raise UserError(f"{path} exists already; save under another name, or pass overwrite=True")
        os.makedirs(folder, exist_ok=True)
        state = _strip(self._adapter_state(trained.adapter), trained.adapter)
        tmp = os.path.join(folder, ".adapter.tmp")
        save_file(state, tmp)
        os.replace(tmp, os.path.join(folder, "adapter.safetensors"))
        meta = {"spec": dataclasses.asdict(trained.spec), "base_model": self.name, "steps": trained.steps}
        if kind == "weights" and trained.optimizer is not None:
            torch.save(trained.optimizer.state_dict(), os.path.join(folder, ".optimizer.tmp"))
            os.replace(os.path.join(folder, ".optimizer.tmp"), os.path.join(folder, "optimizer.pt"))
        with open(os.path.join(folder, ".meta.tmp"), "w") as f:
            json.dump(meta, f)
        os.replace(os.path.join(folder, ".meta.tmp"), os.path.join(folder, "meta.json"))  # written last: complete
        if kind == "sampler_weights":
            self.snapshots[path] = (trained.spec, state)
        return path

    def snapshot(self, model_id: str) -> str:
        """An unnamed sampler snapshot of the adapter, in memory (the newest few per client are kept)."""
        trained = self._get(model_id)
        self._adapter_count += 1
        path = f"tinker://{model_id}/sampler_weights/ephemeral-{self._adapter_count}"
        self.snapshots[path] = (trained.spec, _strip(self._adapter_state(trained.adapter), trained.adapter))
        trained.ephemeral.append(path)
        while len(trained.ephemeral) > EPHEMERAL_KEPT:
            self.snapshots.pop(trained.ephemeral.pop(0), None)
        return path

    def _read(self, path: str) -> tuple[dict, dict[str, Tensor], str]:
        from safetensors.torch import load_file

        folder = self._folder(path)
        meta_path = os.path.join(folder, "meta.json")
        if not os.path.isfile(meta_path):
            raise UserError(f"no checkpoint at {path}")
        with open(meta_path) as f:
            meta = json.load(f)
        return meta, load_file(os.path.join(folder, "adapter.safetensors")), folder

    def load(self, model_id: str, path: str, *, with_optimizer: bool, create: bool) -> None:
        """Load a `weights` (or `sampler_weights`) checkpoint into `model_id`, creating it when `create`."""
        meta, state, folder = self._read(path)
        spec = LoraSpec(**meta["spec"])
        if create:
            self.create_model(model_id, spec)
        try:
            self._load_into(model_id, path, spec, meta, state, folder, with_optimizer)
        except Exception:
            if create:  # the client never gets this model id: leave no half-loaded adapter behind
                self.peft.delete_adapter(self.trained.pop(model_id).adapter)
            raise

    def _load_into(self, model_id, path, spec, meta, state, folder, with_optimizer) -> None:
        trained = self._get(model_id)
        if trained.spec.rank != spec.rank:
            raise UserError(f"{path} has LoRA rank {spec.rank}; model {model_id} has rank {trained.spec.rank}")
        self._copy_into(trained.adapter, state)
        trained.optimizer = None
        optimizer_file = os.path.join(folder, "optimizer.pt")
        if with_optimizer:
            if not os.path.isfile(optimizer_file):
                raise UserError(f"{path} holds no optimizer state (saved with save_weights_for_sampler?)")
            trained.optimizer = torch.optim.AdamW(self._adapter_params(trained.adapter))
            trained.optimizer.load_state_dict(torch.load(optimizer_file, weights_only=True))
        trained.steps = int(meta.get("steps", 0))

    def _copy_into(self, adapter: str, state: Mapping[str, Tensor]) -> None:
        own = {_strip_name(n, adapter): p for n, p in self.peft.named_parameters() if f".{adapter}." in n}
        missing = set(own) - set(state)
        if missing:
            raise UserError(f"the checkpoint lacks {len(missing)} adapter tensors this model has (other targets?)")
        with torch.no_grad():
            for name, param in own.items():
                param.copy_(state[name])

    def sampler_spec(self, path: str) -> LoraSpec:
        if path not in self.snapshots:
            meta, state, _ = self._read(path)
            self.snapshots[path] = (LoraSpec(**meta["spec"]), state)
        return self.snapshots[path][0]

    # ----------------------------------------------------------------------------------------------------------------
    # Sampling
    # ----------------------------------------------------------------------------------------------------------------

    def _use_sampler(self, path: str | None):
        """Make `path`'s adapter (None: the base model) the active one; return the model to call."""
        if path is None:
            if self.peft is None:
                return self.model, None
            return self.peft, self.peft.disable_adapter()
        self.sampler_spec(path)  # read from disk when not in memory
        spec, state = self.snapshots[path]
        if path in self._slots:
            self._slots.move_to_end(path)
            adapter = self._slots[path]
        else:
            if len(self._slots) >= SAMPLER_SLOTS:
                _, old = self._slots.popitem(last=False)
                self.peft.delete_adapter(old)
            adapter = self._add_adapter(spec)
            self._copy_into(adapter, state)
            self._slots[path] = adapter
        self.peft.set_adapter(adapter)
        for param in self._adapter_params(adapter):
            param.requires_grad_(False)
        return self.peft, None

    @torch.no_grad()
    def sample(
        self,
        path: str | None,
        prompt: list[int],
        num_samples: int,
        *,
        max_tokens: int | None,
        temperature: float,
        top_k: int,
        top_p: float,
        stop,
        seed: int | None,
        prompt_logprobs: bool,
        topk_prompt: int,
        topk_sample: int,
        prompt_last_n: int | None,
    ) -> SampleResult:
        self.check_tokens(prompt, "the prompt")
        if num_samples < 1:
            raise UserError(f"num_samples must be >= 1, got {num_samples}")
        if temperature < 0 or not 0 < top_p <= 1:
            raise UserError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature} and {top_p}")
        room = (self.max_length or 1 << 30) - len(prompt)
        max_tokens = room if max_tokens is None else max_tokens
        if max_tokens < 0 or max_tokens > room:
            raise UserError(f"max_tokens={max_tokens} does not fit: the prompt leaves {room} of the context")
        model, context = self._use_sampler(path)
        with context if context is not None else contextlib.nullcontext():
            stop_ids, stop_strings = self._stops(stop)
            rows = [list(prompt) for _ in range(num_samples)]
            outs = self._generate(model, rows, max_tokens, temperature, top_k, top_p, stop_ids, stop_strings, seed)
            return self._score(
                model,
                prompt,
                outs,
                stop_ids,
                stop_strings,
                prompt_logprobs=prompt_logprobs,
                topk_prompt=topk_prompt,
                topk_sample=topk_sample,
                prompt_last_n=prompt_last_n,
            )

    def _stops(self, stop) -> tuple[list[int], list[str]]:
        """The stop token ids and strings: EOS, plus the request's own strings or ids (as vLLM adds them); an empty
        list means no stop at all, EOS included (the SDK's documented meaning)."""
        from grpokit.models import eos_token_ids

        eos = eos_token_ids(self.model, self.tokenizer)
        if stop is None:
            return eos, []
        if isinstance(stop, str):
            return eos, [stop]
        stop = list(stop)
        if not stop:
            return [], []
        if all(isinstance(s, int) for s in stop):
            return eos + [int(s) for s in stop if int(s) not in eos], []
        if all(isinstance(s, str) for s in stop):
            return eos, [str(s) for s in stop]
        raise UserError("stop must be a string, a list of strings or a list of token ids")

    def _generate(self, model, rows, max_tokens, temperature, top_k, top_p, stop_ids, stop_strings, seed):
        from transformers import GenerationConfig, StoppingCriteriaList, StopStringCriteria

        from grpokit.generation.decoding import Unsupported, shared_prefix_decoding

        if max_tokens == 0:
            return [[] for _ in rows]
        pad = self.tokenizer.pad_token_id
        pad = pad if pad is not None else (stop_ids[0] if stop_ids else 0)
        config = GenerationConfig(
            max_new_tokens=max_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_k=top_k if top_k > 0 else None,
            top_p=top_p if temperature > 0 and top_p < 1 else None,
            eos_token_id=stop_ids or None,
            pad_token_id=pad,
        )
        ids = torch.tensor(rows, device=self.device)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        # Stop strings as a criterion of ours: generate() drops its `tokenizer` argument with a callable
        # custom_generate, and its own stop_strings need it.
        extra = {}
        if stop_strings:
            extra["stopping_criteria"] = StoppingCriteriaList([StopStringCriteria(self.tokenizer, stop_strings)])
        # A seeded request draws from its own generator state and leaves the global one as it was; an unseeded one
        # draws from (and advances) the global state, so two unseeded requests differ.
        seeded = torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else [])
        with seeded if seed is not None else contextlib.nullcontext():
            if seed is not None:
                torch.manual_seed(seed)
            try:
                out = model.generate(
                    **inputs, generation_config=config, custom_generate=shared_prefix_decoding, **extra
                )
            except Unsupported:
                out = model.generate(**inputs, generation_config=config, **extra)
        return [row[len(rows[0]) :] for row in out.tolist()]

    def _score(
        self,
        model,
        prompt,
        outs,
        stop_ids,
        stop_strings,
        *,
        prompt_logprobs,
        topk_prompt,
        topk_sample,
        prompt_last_n,
    ) -> SampleResult:
        sequences: list[tuple[list[int], str]] = []
        for out in outs:
            tokens, reason = _cut(out, stop_ids, stop_strings, self.tokenizer)
            sequences.append((tokens, reason))
        rows = [list(prompt) + tokens for tokens, _ in sequences]
        want_prompt = prompt_logprobs or topk_prompt > 0
        if max(len(r) for r in rows) > 1:
            log_probs = torch.log_softmax(self._logits(model, rows)[:, :-1].float(), dim=-1)  # t predicts t + 1
        result = SampleResult(sequences=[])
        P = len(prompt)
        for i, (tokens, reason) in enumerate(sequences):
            if tokens:
                rows_lp = log_probs[i, P - 1 : P - 1 + len(tokens)]
                chosen = rows_lp.gather(-1, torch.as_tensor(tokens, device=rows_lp.device).unsqueeze(-1)).squeeze(-1)
                topk = None
                if topk_sample > 0:
                    values, indices = rows_lp.topk(min(topk_sample, rows_lp.size(-1)), dim=-1)
                    topk = (indices.int().cpu(), values.cpu())
                result.sequences.append(SampleOut(tokens, chosen.cpu().tolist(), reason, topk))
            else:
                result.sequences.append(SampleOut([], [], reason, None))
        if want_prompt:
            first = torch.full((P,), math.nan)
            if P > 1:
                lp = log_probs[0, : P - 1]
                first[1:] = (
                    lp.gather(-1, torch.as_tensor(prompt[1:], device=lp.device).unsqueeze(-1)).squeeze(-1).cpu()
                )
            if prompt_last_n is not None:
                if not 1 <= prompt_last_n <= P - 1:
                    raise UserError(f"prompt_logprobs_last_n={prompt_last_n} must be in [1, {P - 1}]")
                first[: P - prompt_last_n] = math.nan
            result.prompt_logprobs = first if prompt_logprobs else None
            if topk_prompt > 0:
                k = min(topk_prompt, self.vocab_size)
                ids_k = torch.full((P, k), -1, dtype=torch.int32)
                lps_k = torch.full((P, k), math.nan)
                if P > 1:
                    values, indices = log_probs[0, : P - 1].topk(k, dim=-1)
                    ids_k[1:], lps_k[1:] = indices.int().cpu(), values.cpu()
                result.topk_prompt = (ids_k, lps_k)
        return result


def _linear_parts(model) -> list[tuple[str, str]]:
    """Each linear layer of the base model with the part Tinker's LoRA flags name it by."""
    head = model.get_output_embeddings()
    parts = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if module is head:
            part = "unembed"
        elif any(key in name for key in ("attn", "attention")):
            part = "attn"
        elif any(key in name for key in ("mlp", "feed_forward", "ffn")):
            part = "mlp"
        else:
            part = "other"
        parts.append((name, part))
    return parts


def _cut(out: list[int], stop_ids, stop_strings, tokenizer) -> tuple[list[int], str]:
    """The sampled tokens up to and including the first stop token or the token completing a stop string."""
    for i, token in enumerate(out):
        if token in stop_ids:
            return out[: i + 1], "stop"
    if stop_strings:
        for i in range(len(out)):
            text = tokenizer.decode(out[: i + 1])
            if any(s in text for s in stop_strings):
                return out[: i + 1], "stop"
    return out, "length"


def _microbatches(data: Sequence[Datum]) -> list[list[Datum]]:
    pieces: list[list[Datum]] = [[]]
    width = 0
    for datum in data:
        width_then = max(width, len(datum.tokens))
        if pieces[-1] and width_then * (len(pieces[-1]) + 1) > TOKENS_PER_MICROBATCH:
            pieces.append([])
            width_then = len(datum.tokens)
        pieces[-1].append(datum)
        width = width_then
    return pieces


def _strip_name(name: str, adapter: str) -> str:
    return name.replace(f".{adapter}.", ".")


def _strip(state: Mapping[str, Tensor], adapter: str) -> dict[str, Tensor]:
    return {_strip_name(n, adapter): t for n, t in state.items()}
