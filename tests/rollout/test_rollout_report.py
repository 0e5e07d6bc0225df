"""The plain-text completions table."""

from grpokit.rollout.report import completions_table, select_rows

PROMPTS = ["p0", "p0", [{"role": "user", "content": "q"}], [{"role": "user", "content": "q"}]]
COMPLETIONS = ["short", "a\nnewline", "x" * 100, [{"role": "assistant", "content": "ok"}]]


def test_table_layout():
    table = completions_table(
        PROMPTS, COMPLETIONS, {"fmt": [1.0, float("nan"), 0.25, 0.0]}, [0.5, -0.5, 1.0, -1.0], step=7, text_width=20
    )
    lines = table.splitlines()
    assert lines[0] == "completions at step 7"
    assert [c.strip() for c in lines[2].split("|")[1:-1]] == ["prompt", "completion", "fmt", "advantage"]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[4:-1]]
    assert rows[0] == ["p0", "short", "1.00", "0.50"]
    assert rows[1] == ["p0", "a\\nnewline", "nan", "-0.50"]  # newlines shown, NaN (a None reward) spelled out
    assert rows[2][0] == "user: q" and rows[2][1] == "x" * 17 + "..."  # cut to the width
    assert rows[3][1] == "assistant: ok"


def test_row_selection():
    assert select_rows(PROMPTS, None) == [0, 1, 2, 3]
    assert select_rows(PROMPTS, None, unique_prompts=True) == [0, 2]
    picked = select_rows(PROMPTS, 2, seed=0)
    assert len(picked) == 2 and picked == sorted(picked)
