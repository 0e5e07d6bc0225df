"""Where the rollout worker's samples come from, and how the trainer's weights reach it (TRL's
`WeightTransferProtocol`): a vLLM server, or, without vLLM, a private copy of the policy in this process.

`ServerWeightTransfer` pauses the server with `mode=keep` (requests in flight freeze and continue on the new weights
after `resume`, each token's logprob reported under the weights that sampled it), pushes the weights with grpokit's
server backend (gloo on a CPU server, NCCL on CUDA; a LoRA adapter merged into the base weights, as the synchronous
trainer pushes it), then resumes it.

`LocalSampler` generates with transformers from a copy of the policy and scores what it sampled under that copy, so
its samples carry the sampler's log-probabilities as vLLM's do. `LocalWeightTransfer` copies the trainer's weights
into it between two generation calls (pause waits for the one in progress: no completion spans two versions there).

`SyncDeadline` bounds a weight sync by `weight_sync_timeout`: each of the transfer's calls runs in a thread the
trainer stops waiting for at the deadline, so a push to a server that stopped answering mid-push (or a gloo peer that
is gone) ends as one line, whatever the transfer (plugged ones included).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Iterator

import torch

from grpokit.generation import Generated, pad
from grpokit.scoring import score_tokens


class SyncDeadline:
    """The deadline of one weight sync: `seconds` from now (None or <= 0: none). `run(call)` returns None when
    `call()` finished in time, else the one-line reason (`call` raised, or the deadline passed; the stuck call is left
    to its daemon thread)."""

    def __init__(self, seconds: float | None, what: str):
        self.what = what
        self.seconds = seconds if seconds is not None and seconds > 0 else None
        self.end = None if self.seconds is None else time.monotonic() + self.seconds

    def run(self, call: Callable[[], object]) -> str | None:
        outcome: list = []

        def target():
            try:
                call()
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - reported in the trainer's thread
                outcome.append(" ".join(f"{type(exc).__name__}: {exc}".split()))

        thread = threading.Thread(target=target, name="grpokit-weight-sync", daemon=True)
        thread.start()
        thread.join(None if self.end is None else max(self.end - time.monotonic(), 0.0))
        if thread.is_alive():
            return f"{self.what} did not finish within weight_sync_timeout={self.seconds:g}s"
        return outcome[0] and f"{self.what} failed: {outcome[0]}"


def transfer_target(transfer) -> str:
    """What a weight push goes to, for its error lines."""
    if isinstance(transfer, ServerWeightTransfer):
        return f"the vLLM server at {transfer.generator.base_url}"
    if isinstance(transfer, LocalWeightTransfer):
        return "the rollout worker's copy of the policy"
    return f"the weight transfer {type(transfer).__name__}"


class ServerWeightTransfer:
    """TRL's weight-transfer protocol over grpokit's `VLLMServerGenerator` (built for the main process alone)."""

    def __init__(self, generator, policy: Callable[[], torch.nn.Module]):
        self.generator, self.policy = generator, policy

    def init_weight_transfer(self) -> None:
        """Nothing to do ahead: the transfer group is set up by the first push."""

    def pause(self) -> None:
        self.generator._request("POST", "/pause?mode=keep")

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        # The server backend streams the policy itself (merging a LoRA adapter, naming tensors as vLLM does), so the
        # trainer's (name, tensor) pairs are not read.
        self.generator.sync_weights(self.policy())

    def resume(self) -> None:
        self.generator._request("POST", "/resume")

    def destroy(self) -> None:
        self.generator.close()


class LocalSampler:
    """A generation backend over a private copy of the policy, returning the sampler's log-probabilities."""

    def __init__(
        self,
        policy: torch.nn.Module,
        build: Callable[[Callable], object],
        temperature: float,
        pad_id: int,
        truncation=None,
    ):
        self.model = copy.deepcopy(policy).eval()
        self.model.requires_grad_(False)
        self.inner = build(lambda: contextlib.nullcontext(self.model))
        self.temperature, self.pad_id, self.truncation = temperature, pad_id, truncation
        self.lock = threading.Lock()  # held while generating; a weight copy waits for it

    def generate(self, prompt_ids: list[list[int]], vision=None) -> Generated:
        with self.lock:
            generated = self.inner.generate(prompt_ids) if vision is None else self.inner.generate(prompt_ids, vision)
            return Generated(generated.completion_ids, self._logps(prompt_ids, generated.completion_ids, vision))

    @torch.no_grad()
    def _logps(self, prompts: list[list[int]], completions: list[list[int]], vision=None) -> list[list[float]]:
        device = next(self.model.parameters()).device
        prompt = pad(prompts, value=self.pad_id, side="left")
        completion = pad(completions, value=self.pad_id, side="right")
        ids = torch.cat([prompt, completion], dim=1).to(device)
        mask = torch.cat(
            [
                pad([[1] * len(p) for p in prompts], value=0, side="left"),
                pad([[1] * len(c) for c in completions], value=0, side="right"),
            ],
            dim=1,
        ).to(device)
        if completion.size(1) == 0:
            return [[] for _ in completions]
        scores = score_tokens(
            self.model,
            ids,
            mask,
            completion.size(1),
            temperature=self.temperature,
            vision=vision,
            truncation=self.truncation,
        )
        return [row[: len(c)].float().tolist() for row, c in zip(scores.logps, completions, strict=True)]

    def sync_weights(self, model) -> None:
        """Weights arrive through `LocalWeightTransfer`."""


class LocalWeightTransfer:
    """TRL's weight-transfer protocol into a `LocalSampler`: the trainer's parameters copied by name."""

    def __init__(self, sampler: LocalSampler):
        self.sampler = sampler
        self._held = False

    def init_weight_transfer(self) -> None:
        """Nothing to set up: the copy lives in this process."""

    def pause(self) -> None:
        self.sampler.lock.acquire()
        self._held = True

    @torch.no_grad()
    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.sampler.model.named_parameters())
        for name, tensor in iterator:
            target = params.get(name)
            if target is None:
                raise KeyError(f"the sampler's copy of the policy has no parameter {name!r}")
            target.copy_(tensor.to(target.device, target.dtype))

    def resume(self) -> None:
        if self._held:
            self._held = False
            self.sampler.lock.release()

    def destroy(self) -> None:
        self.resume()
