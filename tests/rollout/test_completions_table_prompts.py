"""The completions table shows the user's message when a system prompt is set: a conversation's system messages are
left out of the prompt cell, and a prompt longer than its cell keeps its end."""

from grpokit.rollout.report import completions_table

SYSTEM = "Think step by step, then give the answer in \\boxed{}. Be brief."


def _rows(table):
    lines = table.splitlines()
    return [c.strip() for c in lines[2].split("|")[1:-1]], [
        [c.strip() for c in ln.split("|")[1:-1]] for ln in lines[4:-1]
    ]


def test_a_system_message_leaves_the_user_message_visible():
    prompts = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "7="}]]
    header, rows = _rows(completions_table(prompts, ["7"], {"r": [1.0]}, [0.0], step=1, text_width=20))
    assert header[0] == "prompt (no system)"
    assert rows[0][0] == "user: 7="


def test_a_long_prompt_keeps_its_end():
    text_prompt = SYSTEM + " 12+30="  # a text prompt: the system prompt is its prefix
    chat = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "and 2+2?"},
    ]
    table = completions_table([text_prompt, chat], ["42", "4"], {"r": [1.0, 0.0]}, [0, 0], step=1, text_width=20)
    header, rows = _rows(table)
    assert header[0] == "prompt"  # nothing left out
    assert rows[0][0] == "... Be brief. 12+30="  # "..." and the last 17 characters: 20, the width
    # the conversation's last 17 characters, " | user: and 2+2?" (its messages are joined by " | ")
    assert table.splitlines()[5].startswith("| ... | user: and 2+2? | 4 ")
