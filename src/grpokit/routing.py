"""Mixture-of-experts routing replay: the experts the sampler routed each token to, recorded while it generates, and
used again by the learner's forward, so that the learner's log-probabilities come from the sampler's experts.

When the sampler and the learner route a token to different experts (other kernels, another precision, weights a
step older), the two log-probabilities can differ by far more than rounding and the policy ratio explodes; replaying
the sampler's routing (verl's, slime's and Megatron's "R3") removes that cause. The router still learns: replay fixes
*which* experts a token goes to, and the gate weights of those experts are recomputed from the learner's router
logits (softmax over all experts, gathered at the replayed ones, renormalised where the model renormalises), so the
router's gradient flows as usual.

Routers served: transformers' top-k softmax routers (`*TopKRouter`: Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE and
others built the same way), found by their `weight` and `top_k`, and checked once on a probe input: a router whose
output is not the softmax top-k of its logits (group-limited or sigmoid routing, bias-corrected selection) is refused
in one line. Routes are int tensors `(rows, positions, routers, top_k)`, -1 where nothing is replayed (padding, the
last sampled token, which the sampler never fed back): there the learner routes by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref

import torch
from torch import Tensor, nn

UNROUTED = -1


class ReplayUnsupported(ValueError):
    """The model's routers cannot be replayed (none found, or not a softmax top-k router)."""


def _is_router(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("Router")
        and isinstance(getattr(module, "top_k", None), int)
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 2
    )


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k routers, in forward order (one per MoE layer); each checked once (see the module's text)."""
    found = [m for m in model.modules() if _is_router(m)]
    if not found:
        raise ReplayUnsupported(
            f"routing_replay: {type(model).__name__} has no mixture-of-experts router (a module named *Router with a "
            "weight and top_k); routing replay is for MoE models"
        )
    for router in found:
        _check(router)
    return found


def _normalises(router: nn.Module) -> bool:
    return bool(getattr(router, "norm_topk_prob", True))  # Mixtral's router always renormalises and has no flag


def _gates(router: nn.Module, logits: Tensor, indices: Tensor, dtype: torch.dtype) -> Tensor:
    """The gate weights of `indices` `(n, k)`: softmax of `logits` over all experts, gathered, renormalised where the
    router renormalises, in `dtype` (the router's own output dtype)."""
    values = torch.softmax(logits.float(), dim=-1).gather(-1, indices.long())
    if _normalises(router):
        values = values / values.sum(dim=-1, keepdim=True)
    return values.to(dtype)


def _check(router: nn.Module) -> None:
    """Refuse a router whose scores are not the softmax top-k of its logits (tested on a random probe)."""
    if getattr(router, "_grpokit_checked", False):
        return
    weight = router.weight
    probe = torch.randn(8, weight.size(1), generator=torch.Generator().manual_seed(0)).to(weight.device, weight.dtype)
    with torch.no_grad():
        output = router(probe)
    ok = isinstance(output, tuple) and len(output) == 3
    if ok:
        logits, scores, indices = output
        ok = logits.shape == (8, weight.size(0)) and indices.shape == scores.shape == (8, router.top_k)
        ok = ok and torch.allclose(_gates(router, logits, indices, scores.dtype).float(), scores.float(), atol=1e-4)
    if not ok:
        raise ReplayUnsupported(
            f"routing_replay: {type(router).__name__} does not route by the softmax top-k of its logits (or returns "
            "other outputs than (logits, scores, indices)); its routing cannot be replayed"
        )
    router._grpokit_checked = True


@dataclasses.dataclass
class Agreement:
    """Replayed (token, router) pairs, and how many of them the learner would have routed to the same experts (the
    same set of top-k experts) by itself."""

    replayed: int = 0
    same: int = 0

    @property
    def fraction(self) -> float | None:
        return self.same / self.replayed if self.replayed else None


@contextlib.contextmanager
def replaying(model: nn.Module, routes: Tensor, agreement: Agreement | None = None, *, until_released: bool = False):
    """Within the block, one forward of `model` over `(rows, positions)` tokens routes each token to `routes`
    `(rows, positions, routers, top_k)` (-1: the router's own choice), with gate weights recomputed from the
    router's logits; `agreement` (if given) counts, once per router, how often the router's own top-k was the
    replayed one. `until_released`: the routers keep replaying after the block, until `release(model)`, so that a
    backward pass that recomputes the forward (activation checkpointing) routes as the forward did."""
    found = routers(model)
    if routes.size(2) != len(found):
        raise ValueError(f"routes for {routes.size(2)} routers; the model has {len(found)}")
    release(model)  # a replay left armed (a step that failed between forward and backward) ends here
    for index, router in enumerate(found):
        replay = routes[:, :, index, :].reshape(-1, routes.size(-1))
        router._grpokit_saved = vars(router).get("forward", _CLASS_FORWARD)
        router.forward = _replayed(router, router.forward, replay, agreement)
        _ARMED.add(router)
    try:
        yield
    finally:
        if not until_released:
            release(model)


_CLASS_FORWARD = object()  # the router had no forward of its own (the class's): deleting the wrapper restores it
_ARMED = weakref.WeakSet()  # routers replaying now: release() is free when there are none (every training step)


def release(model: nn.Module) -> None:
    """Restore every router of `model` that `replaying` left replaying (`until_released`); nothing when none is."""
    if not _ARMED:
        return
    for module in model.modules():
        saved = vars(module).pop("_grpokit_saved", None)
        if saved is _CLASS_FORWARD:
            del module.forward
        elif saved is not None:
            module.forward = saved
        _ARMED.discard(module)


def _replayed(router, forward, replay: Tensor, agreement: Agreement | None):
    counted = []  # a recomputation in backward (activation checkpointing) calls the router again: count it once

    def replayed_forward(hidden_states, *args, **kwargs):
        logits, scores, own = forward(hidden_states, *args, **kwargs)
        if replay.size(0) != own.size(0):
            raise ValueError(
                f"routing replay: {type(router).__name__} routed {own.size(0)} tokens, the replayed routes cover "
                f"{replay.size(0)}"
            )
        target = replay.to(own.device)
        known = (target >= 0).all(dim=-1, keepdim=True)
        indices = torch.where(known, target.to(own.dtype), own)
        if agreement is not None and not counted:
            counted.append(True)
            with torch.no_grad():
                same = (own.sort(dim=-1).values == indices.sort(dim=-1).values).all(dim=-1)
                agreement.replayed += int(known.sum())
                agreement.same += int((same & known.squeeze(-1)).sum())
        return logits, _gates(router, logits, indices, scores.dtype), indices

    return replayed_forward


class RouteRecorder:
    """Records every router's choice during generation: `with recorder.recording(model, rows):` around `generate` of
    `rows` sequences, then `rows(prompt_lengths, padded_prompt_length, completion_lengths)` gives each row's routes
    `(prompt + completion tokens, routers, top_k)`, -1 where the sampler never fed the token back (the last sampled
    one). A forward call is seen through the routers alone (the first router starts a step), so a wrapped model (a
    PEFT adapter, whose `generate` calls the model inside) is recorded as a plain one."""

    def __init__(self):
        self.steps: list[list[Tensor]] = []  # per forward call: one (rows, S, k) tensor per router

    @contextlib.contextmanager
    def recording(self, model: nn.Module, rows: int):
        found = routers(model)
        self.steps = []
        handles = [router.register_forward_hook(self._hook(index, rows)) for index, router in enumerate(found)]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _hook(self, index: int, rows: int):
        def record(module, args, output):
            if index == 0:
                self.steps.append([])
            if len(self.steps[-1]) != index:
                raise ValueError(f"routing replay: router {index} ran out of order during generation")
            self.steps[-1].append(output[2].detach().to("cpu", torch.int16).reshape(rows, -1, output[2].size(-1)))

        return record

    def rows(self, prompt_lengths: list[int], padded: int, completion_lengths: list[int]) -> list[Tensor]:
        """Each row's routes: its prompt's real tokens (the last `prompt_lengths[i]` of `padded` left-padded
        positions), then its completion's tokens, -1 for those the sampler never fed back."""
        if not self.steps:
            raise ValueError("routing replay: nothing was recorded (generate made no forward call)")
        steps = [torch.stack(step, dim=2) for step in self.steps]  # (B, S, routers, k) each
        routes = torch.cat(steps, dim=1)  # (B, padded + fed-back completion tokens, routers, k)
        out = []
        for i, (p, c) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
            row = torch.full((p + c, routes.size(2), routes.size(3)), UNROUTED, dtype=torch.int16)
            row[:p] = routes[i, padded - p : padded]
            fed = min(c, routes.size(1) - padded)
            row[p : p + fed] = routes[i, padded : padded + fed]
            out.append(row)
        return out


def padded_routes(rows: list[Tensor], prompt_lengths: list[int], prompt_width: int, completion_width: int) -> Tensor:
    """`(B, prompt_width + completion_width, routers, k)` int routes aligned with a batch whose prompts are
    left-padded to `prompt_width` and completions right-padded to `completion_width`; -1 at padding."""
    routers_, k = rows[0].size(1), rows[0].size(2)
    out = torch.full((len(rows), prompt_width + completion_width, routers_, k), UNROUTED, dtype=torch.int16)
    for i, (row, p) in enumerate(zip(rows, prompt_lengths, strict=True)):
        out[i, prompt_width - p : prompt_width] = row[:p]
        c = row.size(0) - p
        out[i, prompt_width : prompt_width + c] = row[p:]
    return out


def attach(trainer) -> Agreement | None:
    """Routing replay for `trainer` when `routing_replay` is on: its generator records routes (the transformers
    backend; others refused in one line), its policy must have top-k routers; returns the `Agreement` the training
    forward counts into (None when off). Agents (several generate calls per completion) and custom rollouts
    (their own generation) are refused: their routes are not recorded."""
    if not getattr(trainer.args, "routing_replay", False):
        return None
    if getattr(trainer, "agent", None) is not None or getattr(trainer, "rollout_func", None) is not None:
        raise ValueError(
            "routing_replay: an agent's or a rollout_func's completions come from several generate calls or their "
            "own generation, whose routes are not recorded; turn routing_replay off"
        )
    if not hasattr(trainer.generator, "route_recorder"):  # transformers' backend has one (None until set)
        raise ValueError(
            f"routing_replay: the {type(trainer.generator).__name__} backend does not return routed experts yet; "
            "generate with transformers (use_vllm false, no continuous batching)"
        )
    routers(trainer.accelerator.unwrap_model(trainer.model))  # refuses a model without replayable routers
    trainer.generator.route_recorder = RouteRecorder()
    return Agreement()


def batch_routes(inputs: dict) -> Tensor | None:
    """A micro-batch's routes `(B, P + C, routers, k)` from its `prompt_routes` and `completion_routes`, or None."""
    prompt, completion = inputs.get("prompt_routes"), inputs.get("completion_routes")
    return None if prompt is None else torch.cat([prompt, completion], dim=1)


def log_agreement(agreement: Agreement | None, dist, metrics: dict, device) -> None:
    """Append `routing/agreement` to `metrics` (name -> list): the share of replayed (token, router) pairs that the
    model's own routing sent to the same experts, over all processes, since the last call; then reset the counts.
    Nothing when replay is off (`agreement` None)."""
    if agreement is None:
        return
    counts = torch.tensor([agreement.replayed, agreement.same], dtype=torch.float64, device=device)
    agreement.replayed = agreement.same = 0
    replayed, same = dist.sum(counts).tolist()
    if replayed > 0:
        metrics["routing/agreement"].append(same / replayed)
