"""`grpokit train --demo tools`: a tiny model learns to call a tool (the vault demo of `grpokit.demo`)."""

import json
import os
import subprocess
import sys

from grpokit.agents import check_tool_template, parse_turn, tool_suffix_ids
from grpokit.cli import main
from grpokit.demo import VAULT_CALL, Vault, build_vault_tokenizer, vault_reward


def test_vault_reward_by_hand():
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}
    read = {"role": "tool", "name": "open_vault", "content": "4"}
    assert vault_reward(
        [
            [call, read, {"role": "assistant", "content": "41"}],  # opened, read, answered
            [call, read, {"role": "assistant", "content": ""}],  # opened and read, no answer
            [call, read],  # the answer turn was cut
            [{"role": "assistant", "content": "7"}],  # answered without the tool
            [{"role": "assistant", "content": "7"}, read],  # an answer before the tool does not count
        ]
    ) == [1.0, 0.5, 0.5, 0.0, 0.5]


def test_the_vault_environment_and_its_tokenizer():
    vault = Vault()
    vault.reset(secret="6", prompt=[{"role": "user", "content": "?"}])
    assert vault.open_vault() == "6" and vault.opened == 1
    tok = build_vault_tokenizer()
    assert len(tok) == 23
    check_tool_template(tok)  # renders tools and calls; the delimiters are single tokens
    call_ids = tok.convert_tokens_to_ids(["<tool_call>", VAULT_CALL, "</tool_call>", "<eos>"])
    message = parse_turn(tok, call_ids)
    assert message["tool_calls"] == [{"type": "function", "function": {"name": "open_vault", "arguments": {}}}]
    suffix = tool_suffix_ids(tok, [{"role": "tool", "name": "open_vault", "content": "6"}])
    assert tok.convert_ids_to_tokens(suffix) == ["<|tool|>", "6", "<eos>", "<|assistant|>"]


def test_demo_tools_may_come_after_other_flags(capsys, monkeypatch):
    import grpokit.cli.train

    seen = []
    monkeypatch.setattr(grpokit.cli.train, "run_demo", lambda args: seen.append(args) or 0)
    assert main(["train", "--max_steps", "3", "--demo", "tools", "--output_dir", "x"]) == 0
    assert seen == [["tools", "--max_steps", "3", "--output_dir", "x"]]


def test_the_demo_learns_to_call_the_tool(tmp_path):
    """The demo as the README runs it, shortened to 80 steps (about 30 s on 2 cores): the reward starts at 0.2 or
    less (the warmed-up model calls the tool on ~15% of prompts) and ends at 0.8 or more, tool calls with it."""
    out = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "tools", "--output_dir", str(out)]
    command += ["--max_steps", "80", "--logging_steps", "1"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward" in r]
    assert len(rows) == 80
    assert rows[0]["reward"] <= 0.2 and rows[0]["tools/call_frequency"] <= 0.2
    last = rows[-10:]
    assert sum(r["reward"] for r in last) / 10 >= 0.8
    assert sum(r["tools/call_frequency"] for r in last) / 10 >= 0.8
    assert (out / "reward_curve.png").is_file()
    assert "demo: tool calls per completion" in result.stdout
    # An agent run records trajectories without log_completions: 4 of each log, tool turns and rewards included.
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 4 * 80 and {row["step"] for row in logged} == set(range(1, 81))
    assert (
        any(m["role"] == "tool" for row in logged for m in row["completion"])
        and "vault_reward" in logged[0]["rewards"]
    )
    # and prints one, readably (a message a line), with what the reward scores, at the first log and every 10th
    assert result.stdout.count("a trajectory at step") == 8
    assert "  a trajectory at step 1 (vault_reward " in result.stdout
    assert "reward vault_reward: 0.5 when the completion holds the vault's answer as a tool turn" in result.stdout


def test_the_warm_up_answers_after_the_tool_in_another_shape_than_at_once():
    """After the warm-up, an answer after the tool's turn is one digit then <eos>; an answer at once is three digits.
    (With one shape for both, GRPO's push against answering at once also silenced the answer after the tool.)"""
    import torch

    from grpokit.demo import warm_up
    from grpokit.tiny import build_model

    tok = build_vault_tokenizer()
    model = build_model(tok, hidden_size=64, num_layers=2, num_heads=2, seed=0)
    warm_up(model, tok, seed=0)
    model.eval()
    ids = tok.convert_tokens_to_ids
    schema = [{"type": "function", "function": {"name": "open_vault"}}]
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "?"}], tools=schema, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    after_tool = prompt + ids(["<tool_call>", VAULT_CALL, "</tool_call>", "<eos>", "<|tool|>", "6", "<eos>"])
    after_tool += ids(["<|assistant|>"])
    digit_ids = ids(list("0123456789"))

    def next_probs(context):
        with torch.no_grad():
            return model(torch.tensor([context])).logits[0, -1].softmax(-1)

    # an answer after the tool (0.886 on an Intel Xeon with AMX, above 0.9 on an AVX2 AMD EPYC: the warm-up's 80 steps
    # end a little differently with each CPU's float rounding; at once, below, the digits hold 0.9+ everywhere)
    assert next_probs(after_tool)[digit_ids].sum() > 0.85
    assert next_probs(after_tool + ids(["3"]))[ids("<eos>")] > 0.9  # of one digit
    assert next_probs(prompt + ids(["3"]))[digit_ids].sum() > 0.9  # at once: more digits
    assert next_probs(prompt + ids(["3", "3", "3"]))[ids("<eos>")] > 0.9  # three
