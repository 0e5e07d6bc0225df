"""Tool calling (`GRPOTrainer(tools=...)`) with vLLM generating, in colocate mode and against a real
`grpokit vllm-serve` (run in the vLLM venv; skipped where vLLM is not installed):

    VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest tests/vllm_engine/test_vllm_agents.py

Colocate: the engine itself writes the tool call. The policy is a hand-set one-layer Qwen2 (`_handmade_policy`) whose
greedy and sampled output, at temperature 1, is `<tool_call>BODY</tool_call><eos>` after the prompt (BODY: one added
token holding the call's JSON) and `<eos>` once a tool turn is in its context, each token with probability
1 - 1.2e-5, so its logprobs are small but not 0.0.

Server: a random tiny model never writes a well-formed call, so the first turn of some rollouts is scripted: the
backend is wrapped and, on a first turn (a prompt with no tool turn in it), the even rows get a fixed `<tool_call>`
whose logprobs are the live policy's own (so the run stays on-policy), the odd rows keep what the engine generated.
Every later turn (after the tool turn) comes from the real server.

Checked per rollout: the tool ran with the parsed arguments; the completion is the first turn's ids, the tool turn's
ids (`tool_suffix_ids`), then the engine's turn; the tool mask; the sampling logprobs are 0.0 exactly on the tool turn
and the engine's own on its turns; the tool metrics; and the trainer's importance-sampling diagnostics (the tool turn
is outside them, so they stay at 1). A last test runs the tool loop over two "processes" sharing the server, only one
of which calls a tool.
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from _serve import free_port as _free_port  # noqa: E402
from _serve import running_server  # noqa: E402
from _threads import ThreadCollectives  # noqa: E402
from datasets import Dataset  # noqa: E402

from grpokit import GRPOConfig, GRPOTrainer  # noqa: E402
from grpokit.agents.loop import run_tool_loop, tool_suffix_ids  # noqa: E402
from grpokit.generation import Generated  # noqa: E402
from grpokit.tiny import build_model, build_tool_tokenizer  # noqa: E402

TOKEN = "agents-token-91c2"
MAX_COMPLETION = 96  # the scripted call is 49 tokens, the tool turn 6
ROWS = 4  # per generation round: 2 prompts x num_generations 2
RESULT = "VAL"
BODY = '{"name": "lookup", "arguments": {"key": "k7"}}'
CALL = f"<tool_call>{BODY}</tool_call><eos>"


def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key
    """
    CALLS.append(key)
    return RESULT


CALLS: list[str] = []


@pytest.fixture(scope="module")
def tokenizer():
    return build_tool_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    # head_dim 32: the smallest head size vLLM's CPU attention takes
    path = tmp_path_factory.mktemp("tool_policy")
    build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=5).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def handmade(tmp_path_factory):
    """(folder, tokenizer) of `_handmade_policy`."""
    path = tmp_path_factory.mktemp("handmade_policy")
    tokenizer = _handmade_policy(path)
    return str(path), tokenizer


def _handmade_policy(path):
    """A one-layer Qwen2 (head size 32, untied head) whose next token depends only on the current token and on
    whether a `<|tool|>` token is anywhere in the context, saved with its tokenizer (the tool tokenizer plus BODY as
    one token). Every weight is 0 except:
    - the embeddings: one-hot for <|tool|>, <|assistant|>, <tool_call>, BODY, </tool_call> (dims 0-4), random in dims
      6-62 for the other tokens, 0 in dim 63 for all;
    - attention: q = k = 0, so every position attends uniformly to its prefix; v reads dim 0 (<|tool|>, 8 after
      the input RMSNorm) and o_proj writes it, x2000, to dim 63: a "tool turn seen" flag, 16000 / (prefix length)
      per <|tool|> token (about 50 here), exactly 0 before any tool turn;
    - the head: <|assistant|> -> <tool_call> -> BODY -> </tool_call> -> <eos> with logit 16 (the final RMSNorm makes
      a one-hot 8), and the flag -> <eos> with logit about 16, which outweighs the first rule once a tool turn is in
      the context. Every chosen token has probability 1 - 107 e^-16."""
    from transformers import AddedToken, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tool_tokenizer()
    tokenizer.add_tokens([AddedToken(BODY, special=True, normalized=False)], special_tokens=True)
    ids = tokenizer.convert_tokens_to_ids
    tool, assistant, open_, body, close = (
        ids(t) for t in ("<|tool|>", "<|assistant|>", "<tool_call>", BODY, "</tool_call>")
    )
    eos = tokenizer.eos_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        embeddings = model.model.embed_tokens.weight
        embeddings[:, 6:63] = torch.randn(len(tokenizer), 57, generator=torch.Generator().manual_seed(0))
        for dim, token in enumerate([tool, assistant, open_, body, close]):
            embeddings[token].zero_()
            embeddings[token, dim] = 1.0
        attention = model.model.layers[0].self_attn
        attention.v_proj.weight[0, 0] = 1.0
        attention.o_proj.weight[63, 0] = 2000.0
        head = model.lm_head.weight
        head[open_, 1] = head[body, 2] = head[close, 3] = head[eos, 4] = 2.0
        head[eos, 63] = 2.0
    model.generation_config.eos_token_id = eos
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return tokenizer


@pytest.fixture(scope="module", autouse=True)
def token():
    previous = os.environ.get("GRPOKIT_VLLM_TOKEN")
    os.environ["GRPOKIT_VLLM_TOKEN"] = TOKEN
    yield TOKEN
    if previous is None:
        del os.environ["GRPOKIT_VLLM_TOKEN"]
    else:
        os.environ["GRPOKIT_VLLM_TOKEN"] = previous


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory, token):
    """`grpokit vllm-serve` of the tool policy on a free port; the whole process group stopped at the end."""
    log_path = tmp_path_factory.mktemp("server") / "vllm.log"
    with running_server(model_dir, log_path, token=token, max_model_len=512) as running:
        yield running.port


class ScriptedFirstTurn:
    """Wraps the trainer's backend: a first turn (no tool turn in the prompt) of an even row becomes `CALL`, with the
    live policy's logprobs of those tokens at `temperature`; everything else is the real backend's. Logs every call
    (prompts in, Generated out, and which rows were scripted)."""

    def __init__(self, trainer, call_ids: list[int], tool_token: int, temperature: float, script: bool = True):
        self.trainer, self.inner, self.script = trainer, trainer.generator, script
        self.call_ids, self.tool_token, self.temperature = call_ids, tool_token, temperature
        self.log: list[dict] = []

    def __getattr__(self, name):  # sync_weights, close, last_sync_seconds, ...
        return getattr(self.inner, name)

    def generate(self, prompt_ids):
        out = self.inner.generate(prompt_ids)
        assert out.logprobs is not None, "a vLLM backend reports sampling logprobs"
        first = not any(self.tool_token in p for p in prompt_ids)
        ids, logprobs, scripted = [list(c) for c in out.completion_ids], [list(lp) for lp in out.logprobs], []
        if first and self.script:
            for i in range(0, len(prompt_ids), 2):
                ids[i], logprobs[i] = list(self.call_ids), self._policy_logprobs(prompt_ids[i], self.call_ids)
                scripted.append(i)
        result = Generated(ids, logprobs)
        self.log.append(
            {"prompts": [list(p) for p in prompt_ids], "out": result, "first": first, "scripted": scripted}
        )
        return result

    @torch.no_grad()
    def _policy_logprobs(self, prompt: list[int], completion: list[int]) -> list[float]:
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
        logps = (logits / self.temperature).log_softmax(-1)
        return logps.gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


def _train(model_dir, tokenizer, tmp_path, script=True, **vllm_args):
    """Two steps of a tool-calling run with vLLM; returns the trainer, the backend's log per generation round and
    the rollouts (`Agent.generate`'s 8-tuples) per round."""
    CALLS.clear()
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(2 * ROWS)]

    def length_reward(completions, **kwargs):
        return [float(len(str(c))) for c in completions]

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=ROWS,
        num_generations=2,
        max_completion_length=MAX_COMPLETION,
        max_steps=2,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        use_vllm=True,
        **vllm_args,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        processing_class=tokenizer,
        reward_funcs=length_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        tools=[lookup],
    )
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    tool_token = tokenizer.convert_tokens_to_ids("<|tool|>")
    backend = ScriptedFirstTurn(trainer, call_ids, tool_token, args.temperature, script)
    trainer.generator = backend
    rounds, generate = [], trainer.agent.generate

    def recorded(*a, **k):
        start = len(backend.log)
        out = generate(*a, **k)
        rounds.append({"out": out, "calls": backend.log[start:], "loop": trainer.agent.last})
        return out

    trainer.agent.generate = recorded
    trainer.train()
    return trainer, rounds, call_ids


def _check_rounds(rounds, call_ids, tokenizer):
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "lookup", "content": RESULT}])
    tool_token = tokenizer.convert_tokens_to_ids("<|tool|>")
    assert suffix[0] == tool_token and suffix[-1] == tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert len(rounds) == 2  # one generation round per step
    for round_ in rounds:
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, images, tool_images = round_["out"]
        first, *later = round_["calls"]
        assert first["first"] and first["prompts"] == prompt_ids and first["scripted"] == [0, 2]
        # one tool round: the engine's turns after the tool turn call nothing (a random policy)
        assert len(later) == 1 and not later[0]["first"], [c["prompts"] for c in later]
        turn = later[0]
        assert round_["loop"].num_calls == 2 and round_["loop"].dropped == 0
        engine_rows = 0
        for i in range(ROWS):
            if i % 2:  # not scripted: the engine's first turn, untouched
                assert completion_ids[i] == first["out"].completion_ids[i]
                assert logprobs[i] == first["out"].logprobs[i]
                assert tool_mask[i] == [1] * len(completion_ids[i])
                continue
            sequence = prompt_ids[i] + call_ids + suffix
            n = turn["prompts"].index(sequence)  # the tool turn was appended as ids, nothing retokenized
            engine_ids = turn["out"].completion_ids[n]
            engine_logprobs = turn["out"].logprobs[n]
            room = MAX_COMPLETION - len(call_ids) - len(suffix)
            kept = engine_ids[:room]
            assert kept, "the engine generated the turn after the tool turn"
            assert completion_ids[i] == call_ids + suffix + kept
            assert tool_mask[i] == [1] * len(call_ids) + [0] * len(suffix) + [1] * len(kept)
            assert logprobs[i][: len(call_ids)] == first["out"].logprobs[i]
            assert logprobs[i][len(call_ids) : len(call_ids) + len(suffix)] == [0.0] * len(suffix)
            assert logprobs[i][len(call_ids) + len(suffix) :] == engine_logprobs[: len(kept)]
            assert all(lp < 0.0 for lp in engine_logprobs[: len(kept)])  # real sampling logprobs, not filler
            messages = completions[i]
            assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
            call = messages[0]["tool_calls"][0]["function"]
            assert call == {"name": "lookup", "arguments": {"key": "k7"}}
            assert messages[1] == {"role": "tool", "name": "lookup", "content": RESULT}
            engine_rows += 1
        assert engine_rows == 2 and len(turn["prompts"]) == 2
        assert extra == {} and images is None and tool_images == []


def _check_metrics(trainer):
    steps = [row for row in trainer.state.log_history if "loss" in row]
    assert len(steps) == 2
    for row in steps:
        assert row["tools/call_frequency"] == 0.5  # 2 of 4 rollouts called once
        assert row["tools/failure_frequency"] == 0.0
        # The scripted turn carries the policy's logprobs and the engine's turn the engine's: on-policy, so the
        # importance ratio is 1 wherever the model wrote; a tool token counted there (logprob 0.0) would break it.
        assert row["sampling/sampling_logp_difference/max"] < 1e-3, row
        assert abs(row["sampling/importance_sampling_ratio/min"] - 1) < 1e-3, row
        assert abs(row["sampling/importance_sampling_ratio/max"] - 1) < 1e-3, row


def test_tools_with_vllm_colocate_engine_writes_the_call(handmade, tmp_path):
    """No scripting: the colocated engine generates the call, the tool runs, the engine generates the next turn."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model_dir, tokenizer = handmade
    trainer, rounds, call_ids = _train(
        model_dir, tokenizer, tmp_path, script=False, vllm_mode="colocate", vllm_max_model_length=512
    )
    try:
        assert CALLS == ["k7"] * 8  # 2 rounds x 4 rollouts, arguments as parsed from the engine's BODY token
        assert len(call_ids) == 4  # <tool_call> BODY </tool_call> <eos>
        suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "lookup", "content": RESULT}])
        assert len(rounds) == 2
        for round_ in rounds:
            prompt_ids, completion_ids, tool_mask, completions, logprobs, *_ = round_["out"]
            first, turn = round_["calls"]  # the first turn, then one tool round; no more
            assert first["first"] and not first["scripted"] and not turn["first"]
            assert first["out"].completion_ids == [call_ids] * ROWS  # the engine wrote the call
            assert turn["prompts"] == [p + call_ids + suffix for p in prompt_ids]
            assert turn["out"].completion_ids == [[tokenizer.eos_token_id]] * ROWS  # and ended after the tool turn
            for i in range(ROWS):
                assert completion_ids[i] == call_ids + suffix + [tokenizer.eos_token_id]
                assert tool_mask[i] == [1] * 4 + [0] * len(suffix) + [1]
                expected = first["out"].logprobs[i] + [0.0] * len(suffix) + turn["out"].logprobs[i]
                assert logprobs[i] == expected
                engine = first["out"].logprobs[i] + turn["out"].logprobs[i]
                assert all(-1e-3 < lp < 0.0 for lp in engine), engine  # the engine's own, not a 0.0 filler
                assert [m["role"] for m in completions[i]] == ["assistant", "tool", "assistant"]
                assert completions[i][0]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": {"key": "k7"}}
        steps = [row for row in trainer.state.log_history if "loss" in row]
        assert len(steps) == 2
        for row in steps:
            assert row["tools/call_frequency"] == 1.0 and row["tools/failure_frequency"] == 0.0
            assert row["sampling/sampling_logp_difference/max"] < 1e-4, row
            assert abs(row["sampling/importance_sampling_ratio/min"] - 1) < 1e-4, row
            assert abs(row["sampling/importance_sampling_ratio/max"] - 1) < 1e-4, row
    finally:
        trainer.generator.close()


def test_tools_with_vllm_server(server, model_dir, tokenizer, tmp_path):
    trainer, rounds, call_ids = _train(
        model_dir,
        tokenizer,
        tmp_path,
        vllm_mode="server",
        vllm_server_host="127.0.0.1",
        vllm_server_port=server,
        vllm_group_port=_free_port(),
        vllm_server_timeout=60,
    )
    try:
        assert CALLS == ["k7"] * 4
        _check_rounds(rounds, call_ids, tokenizer)
        _check_metrics(trainer)
    finally:
        trainer.generator.close()


def test_server_tool_rounds_across_two_processes(server, model_dir, tokenizer):
    """The tool loop over two "processes" (threads) sharing the server: process 0's first rollout calls the tool,
    process 1 has nothing pending. Process 1 still sends a throwaway turn in the round (the server backend gathers
    every process's rows into one request), the request mixes one tool-loop sequence with it (rows that are not
    groups of num_generations), and each process gets back its own rows."""
    from grpokit.agents.parsing import parse_turn
    from grpokit.agents.tools import ToolBox
    from grpokit.generation.vllm_common import sampling_kwargs
    from grpokit.generation.vllm_server import VLLMServerGenerator

    CALLS.clear()
    schemas = ToolBox([lookup]).schemas()
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "lookup", "content": RESULT}])
    sampling = sampling_kwargs(
        SimpleNamespace(
            repetition_penalty=1.0,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            min_p=None,
            max_completion_length=MAX_COMPLETION,
            vllm_structured_outputs_regex=None,
            generation_kwargs=None,
        ),
        n=2,
    )
    collectives = ThreadCollectives(2)
    results, errors, turns = [None, None], [], [[], []]

    def run(rank):
        try:
            generator = VLLMServerGenerator(
                base_url=f"http://127.0.0.1:{server}",
                timeout=30,
                group_port=_free_port(),
                sampling=sampling,
                num_generations=2,
                eos_token_ids=[tokenizer.eos_token_id],
                model_name=model_dir,
                dist=collectives[rank],
            )

            def generate(prompt_ids):
                out = generator.generate(prompt_ids)
                turns[rank].append(([list(p) for p in prompt_ids], out))
                return out

            message = [{"role": "user", "content": f"q{rank}"}]
            prompt = tokenizer.apply_chat_template(message, tools=schemas, add_generation_prompt=True, tokenize=True)
            prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
            prompt_ids = [prompt, prompt]
            first = generate(prompt_ids)
            completion_ids = [list(c) for c in first.completion_ids]
            logprobs = [list(lp) for lp in first.logprobs]
            if rank == 0:
                completion_ids[0], logprobs[0] = list(call_ids), [-1.0] * len(call_ids)
            first_turns = [parse_turn(tokenizer, ids, prefix=prompt, tools=schemas) for ids in completion_ids]
            results[rank] = run_tool_loop(
                prompt_ids,
                completion_ids,
                logprobs,
                first_turns,
                toolboxes=[ToolBox([lookup])] * 2,
                generate=generate,
                parse=lambda i, ids, prefix: parse_turn(tokenizer, ids, prefix=prefix, tools=schemas),
                suffix=lambda messages: tool_suffix_ids(tokenizer, messages),
                max_iterations=None,
                max_completion_length=MAX_COMPLETION,
                max_positions=512,
                dist=collectives[rank],
            )
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
            collectives.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a process is stuck in the tool loop's collectives"
    assert CALLS == ["k7"]
    # Both took part in the same number of generate calls: the first turn, then the one tool round.
    assert [len(t) for t in turns] == [2, 2]
    (sequences, engine), (throwaway, _) = turns[0][1], turns[1][1]
    assert len(sequences) == 1 and len(throwaway) == 1 and throwaway[0] == turns[1][0][0][0]
    loop = results[0]
    kept = engine.completion_ids[0][: MAX_COMPLETION - len(call_ids) - len(suffix)]
    assert sequences[0][-len(call_ids) - len(suffix) :] == call_ids + suffix
    assert loop.completion_ids[0] == call_ids + suffix + kept
    assert loop.tool_mask[0] == [1] * len(call_ids) + [0] * len(suffix) + [1] * len(kept)
    assert loop.logprobs[0] == [-1.0] * len(call_ids) + [0.0] * len(suffix) + engine.logprobs[0][: len(kept)]
    assert results[0].completion_ids[1] == turns[0][0][1].completion_ids[1]  # rollout 1 called nothing
    assert results[1].completion_ids == turns[1][0][1].completion_ids and results[1].num_calls == 0
