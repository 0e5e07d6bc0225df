import json

import pytest

from grpokit.config.script_args import DatasetConfig, DatasetMixtureConfig, GRPOScriptArguments
from grpokit.data import DataError, load_mixture, load_train_eval, prepare_prompts, with_system_prompt


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_local_jsonl_with_prompt_column_and_system_prompt(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"question": "1+1?", "solution": "2"}, {"question": "2+2?", "solution": "4"}])
    args = GRPOScriptArguments(dataset_name=path, dataset_prompt_column="question", system_prompt="Be brief.")
    train, evaluation = load_train_eval(args, DatasetMixtureConfig(), want_eval=False)
    assert evaluation is None
    assert train["prompt"] == ["Be brief.\n1+1?", "Be brief.\n2+2?"]
    assert train["solution"] == ["2", "4"]  # other columns reach the reward functions


def test_conversational_prompt_gets_a_system_message():
    prompt = [{"role": "user", "content": "hi"}]
    assert with_system_prompt(prompt, "sys") == [{"role": "system", "content": "sys"}, *prompt]
    already = [{"role": "system", "content": "mine"}, *prompt]
    assert with_system_prompt(already, "sys") == already


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"prompt": "ok"}, {"prompt": ""}], "train row 1: prompt is empty"),
        ([{"prompt": "ok"}, {"prompt": None}], "train row 1: prompt is missing"),
        ([{"prompt": []}], "train row 0: prompt is an empty conversation"),
        ([{"prompt": [{"text": "x"}]}], "train row 0: prompt is a list whose items are not chat messages"),
        (
            [{"prompt": [{"role": "usr", "content": "a"}]}],
            "train row 0: prompt message 0: role 'usr' is not one of system, developer, user, assistant, tool",
        ),
        (
            [{"prompt": [{"role": "user", "content": [{"text": "a"}]}]}],
            "train row 0: prompt message 0: content has type list; expected text or a list of content blocks",
        ),
    ],
)
def test_bad_prompt_rows_name_their_index(rows, message):
    from datasets import Dataset

    with pytest.raises(DataError, match=message):
        prepare_prompts(Dataset.from_list(rows))


def test_missing_prompt_column_suggests(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"promt": "x"}])
    with pytest.raises(DataError, match="no prompt column 'prompt'.*did you mean 'promt'"):
        load_train_eval(GRPOScriptArguments(dataset_name=path), DatasetMixtureConfig(), want_eval=False)


@pytest.mark.parametrize("ext", ["csv", "parquet", "json"])
def test_other_local_formats(tmp_path, ext):
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt": ["a", "b", "c"]})
    path = str(tmp_path / f"d.{ext}")
    getattr(ds, f"to_{ext}")(path)
    train, _ = load_train_eval(GRPOScriptArguments(dataset_name=path), DatasetMixtureConfig(), want_eval=False)
    assert train["prompt"] == ["a", "b", "c"]


def test_local_directory_with_splits(tmp_path):
    _jsonl(tmp_path / "train.jsonl", [{"prompt": "t"}])
    _jsonl(tmp_path / "test.jsonl", [{"prompt": "e"}])
    args = GRPOScriptArguments(dataset_name=str(tmp_path))
    train, evaluation = load_train_eval(args, DatasetMixtureConfig(), want_eval=True)
    assert train["prompt"] == ["t"] and evaluation["prompt"] == ["e"]
    with pytest.raises(DataError, match="no split 'tset'; did you mean 'test'"):
        load_train_eval(
            GRPOScriptArguments(dataset_name=str(tmp_path), dataset_test_split="tset"),
            DatasetMixtureConfig(),
            want_eval=True,
        )


def test_hub_id_offline_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="offline") as info:
        load_train_eval(
            GRPOScriptArguments(dataset_name="nobody/no-such-dataset"), DatasetMixtureConfig(), want_eval=False
        )
    assert "\n" not in str(info.value)


def test_mixture_fractions_are_target_shares(tmp_path):
    # a has 10 rows, b has 4. Shares 0.5/0.5 -> total = min(10/0.5, 4/0.5) = 8 -> 4 rows of each.
    a = _jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i}", "x": 1} for i in range(10)])
    b = _jsonl(tmp_path / "b.jsonl", [{"prompt": f"b{i}", "y": 2} for i in range(4)])
    mixture = DatasetMixtureConfig(
        datasets=[
            DatasetConfig(path=a, columns=["prompt"], fraction=0.5),
            DatasetConfig(path=b, columns=["prompt"], fraction=0.5),
        ]
    )
    train = load_mixture(mixture)["train"]
    assert train["prompt"] == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]


def test_mixture_fraction_on_some_entries_only_is_an_error(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"prompt": "a"}])
    mixture = DatasetMixtureConfig(datasets=[DatasetConfig(path=a, fraction=0.5), DatasetConfig(path=a)])
    with pytest.raises(DataError, match="every entry of the mixture or on none"):
        load_mixture(mixture)


def test_mixture_test_split(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i}"} for i in range(10)])
    splits = load_mixture(DatasetMixtureConfig(datasets=[DatasetConfig(path=a)], test_split_size=0.2))
    assert len(splits["train"]) == 8 and len(splits["test"]) == 2


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("empty.jsonl", b"", "the file is empty"),
        ("blank.jsonl", b"\n\n", "the file holds only whitespace"),
        # a row cut short: the line and what the JSON parser expected there
        (
            "cut.jsonl",
            b'{"prompt": "a"}\n{"prompt": "b"\n',
            "line 2: not valid JSON (Expecting ',' delimiter at column 15)",
        ),
        ("list.jsonl", b'{"prompt": "a"}\n[1, 2]\n', "line 2: a JSON list, where each line must be an object"),
        ("latin1.csv", b"prompt\ncaf\xe9\n", "line 2: not UTF-8 text (byte 0xe9); save the file as UTF-8"),
        ("latin1.jsonl", b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n', "line 2: not UTF-8 text (byte 0xe9)"),
        ("bad.json", b'[{"prompt": "a"}, {"prompt": }]', "line 1: not valid JSON (Expecting value at column 30)"),
    ],
)
def test_unreadable_local_files_say_why(tmp_path, name, content, reason):
    path = tmp_path / name
    path.write_bytes(content)
    script = GRPOScriptArguments(dataset_name=str(path))
    with pytest.raises(DataError) as info:
        load_train_eval(script, None, want_eval=False)
    assert str(info.value).startswith(f"dataset {str(path)!r} could not be loaded: {reason}")
    assert "\n" not in str(info.value)


def test_single_dataset_without_eval_split_names_both_ways(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    with pytest.raises(DataError) as info:
        load_train_eval(GRPOScriptArguments(dataset_name=path), DatasetMixtureConfig(), want_eval=True)
    message = str(info.value)
    assert message.startswith(f"dataset {path!r} has no split 'test'; it has train. For evaluation, ")
    assert "dataset_test_split to a local eval file" in message and "test_split_size to hold out" in message
    assert "\n" not in message


def test_eval_file_as_dataset_test_split(tmp_path):
    train_path = _jsonl(tmp_path / "d.jsonl", [{"question": "t1"}, {"question": "t2"}])
    eval_path = _jsonl(tmp_path / "e.jsonl", [{"question": "e1"}])
    args = GRPOScriptArguments(dataset_name=train_path, dataset_test_split=eval_path, dataset_prompt_column="question")
    train, evaluation = load_train_eval(args, DatasetMixtureConfig(), want_eval=True)
    assert train["prompt"] == ["t1", "t2"] and evaluation["prompt"] == ["e1"]  # same prompt handling as train
    assert load_train_eval(args, DatasetMixtureConfig(), want_eval=False)[1] is None
    # a mixture takes an eval file too
    mixture = DatasetMixtureConfig(datasets=[DatasetConfig(path=train_path)])
    assert load_train_eval(args, mixture, want_eval=True)[1]["prompt"] == ["e1"]
    missing = GRPOScriptArguments(dataset_name=train_path, dataset_test_split=str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match=r"^dataset_test_split \(the eval file\): dataset file .*nope.jsonl does not"):
        load_train_eval(missing, DatasetMixtureConfig(), want_eval=True)


def test_test_split_size_holds_out_rows_of_a_single_dataset(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(10)])
    args = GRPOScriptArguments(dataset_name=path)
    train, evaluation = load_train_eval(args, DatasetMixtureConfig(test_split_size=0.2), want_eval=True)
    assert len(train) == 8 and len(evaluation) == 2
    assert sorted([*train["prompt"], *evaluation["prompt"]]) == sorted(f"p{i}" for i in range(10))
    again = load_train_eval(args, DatasetMixtureConfig(test_split_size=0.2), want_eval=True)[1]
    assert list(again["prompt"]) == list(evaluation["prompt"])  # the same rows every time (resumed runs too)
    train, evaluation = load_train_eval(args, DatasetMixtureConfig(test_split_size=3), want_eval=True)
    assert len(train) == 7 and len(evaluation) == 3  # 1 or more: a number of rows
    with pytest.raises(DataError, match="test_split_size=10: dataset .* has 10 rows, too few"):
        load_train_eval(args, DatasetMixtureConfig(test_split_size=10), want_eval=True)
    with pytest.raises(DataError, match="test_split_size=2.5: a number of rows must be whole"):
        load_train_eval(args, DatasetMixtureConfig(test_split_size=2.5), want_eval=True)
    eval_file = _jsonl(tmp_path / "e.jsonl", [{"prompt": "e"}])
    both = GRPOScriptArguments(dataset_name=path, dataset_test_split=eval_file)
    with pytest.raises(DataError, match="both give eval data; set one of them"):
        load_train_eval(both, DatasetMixtureConfig(test_split_size=0.2), want_eval=True)


def test_mixture_without_eval_data_names_both_ways(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"prompt": "a"}])
    mixture = DatasetMixtureConfig(datasets=[DatasetConfig(path=a)])
    with pytest.raises(DataError, match="mixture has no eval data; set dataset_test_split to a local eval file"):
        load_train_eval(GRPOScriptArguments(), mixture, want_eval=True)


def test_content_blocks_and_tool_call_turns_are_messages(tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {
            "prompt": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "w", "arguments": {}}}]},
                {"role": "tool", "content": "sunny"},
            ]
        },
    ]
    train, _ = load_train_eval(
        GRPOScriptArguments(dataset_name=_jsonl(tmp_path / "d.jsonl", rows)), DatasetMixtureConfig(), want_eval=False
    )
    assert train["prompt"][0][0]["content"] == [{"type": "text", "text": "hi"}]
    assert train["prompt"][1][2] == {"role": "tool", "content": "sunny"}


def test_a_message_whose_content_is_a_number_is_named(tmp_path):
    # the probe's row: it crashed inside the chat template
    rows = [{"prompt": [{"role": "user", "content": "a"}]}, {"prompt": [{"role": "user", "content": 5}]}]
    with pytest.raises(DataError) as info:
        load_train_eval(
            GRPOScriptArguments(dataset_name=_jsonl(tmp_path / "d.jsonl", rows)),
            DatasetMixtureConfig(),
            want_eval=False,
        )
    assert str(info.value) == (
        "train row 1: prompt message 0: content has type int; expected text or a list of content blocks "
        "({'type': 'text', 'text': ...})"
    )


def test_a_dataset_mixing_text_and_chat_prompts_is_refused_at_the_first_odd_row(tmp_path):
    path = _jsonl(
        tmp_path / "mixed.jsonl",
        [{"prompt": "plain"}, {"prompt": "also plain"}, {"prompt": [{"role": "user", "content": "chat"}]}],
    )
    with pytest.raises(DataError) as info:
        load_train_eval(GRPOScriptArguments(dataset_name=path), DatasetMixtureConfig(), want_eval=False)
    assert str(info.value) == (
        "train row 2: prompt is a conversation, but row 0's is text; a dataset holds one kind of prompt (write the "
        "text ones as [{'role': 'user', 'content': ...}])"
    )
