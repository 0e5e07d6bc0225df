"""Plain helpers shared by the trainer tests."""

PROMPTS = ["ab", "cde", "fghi", "jk", "lmnop", "qr", "stu", "vwxyz"]


def text_reward(completions, **kwargs):
    """A deterministic score of the text that varies a lot between completions, so advantages are rarely all 0."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [(sum(map(ord, t)) % 13) / 13 for t in texts]


def parameters(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def changed(before, model) -> bool:
    return any(not (p.detach() == before[name]).all() for name, p in model.named_parameters() if name in before)


def last_log_with(trainer, key):
    """The most recent log entry that has `key`."""
    for entry in reversed(trainer.state.log_history):
        if key in entry:
            return entry
    raise AssertionError(
        f"{key!r} was never logged; keys: {sorted({k for e in trainer.state.log_history for k in e})}"
    )
