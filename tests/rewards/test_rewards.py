"""Built-in rewards, registry and spec resolution.

Expected values are worked out by hand (arithmetic in the comments). Rewards that check math answers are tested
twice: their length/skip logic with a fake answer checker (no math-verify needed), and end to end with math-verify
when it is installed.
"""

from __future__ import annotations

import doctest
import math
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import grpokit.rewards as R
from grpokit.rewards import _math, openr1_rewards, registry, trl_rewards

HELPERS_DIR = Path(__file__).parent


def as_format(texts, fmt):
    """The same completions in the standard (strings) or conversational (message lists) format."""
    if fmt == "standard":
        return list(texts)
    return [[{"role": "assistant", "content": text}] for text in texts]


FORMATS = ["standard", "conversational"]


@pytest.fixture
def fake_checker(monkeypatch):
    """Answer checking without math-verify: gold "???" is unparsable, an answer is the first \\boxed{...}."""

    def load(flavor, reward):
        return _math.Checker(
            parse_gold=lambda solution: [] if solution == "???" else [solution],
            parse_answer=lambda text: re.findall(r"\\boxed\{([^}]*)\}", text)[:1],
            verify=lambda gold, answer: gold[0] == answer[0],
        )

    monkeypatch.setattr(_math, "load_checker", load)


@pytest.fixture
def helpers_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HELPERS_DIR))


# ------------------------------------------------------------------------------------------------ format rewards


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>\nreasoning\n</think>\nanswer", 1.0),
        ("<think></think>", 1.0),  # empty reasoning is still closed
        ("<think>\nreasoning, no closing tag", 0.0),
        ("Sure! <think>x</think> y", 0.0),  # must start with <think>
        ("<think>a<think>b</think>", 0.0),  # a second <think>
        ("<think>a</think><think>b</think>", 0.0),
        ("</think>", 0.0),
    ],
)
def test_think_format_reward(fmt, text, expected):
    assert R.think_format_reward(as_format([text], fmt)) == [expected]


WELL_FORMED = "<think>\nreasoning\n</think>\n<answer>\n42\n</answer>"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "text, expected",
    [
        (WELL_FORMED, 1.0),
        ("<think>\nline 1\nline 2\n</think>\n<answer>\n4\n2\n</answer>", 1.0),  # parts span lines
        (WELL_FORMED + "\nmore text", 1.0),  # open-r1 quirk: `$` matches at any line end (MULTILINE)
        (WELL_FORMED + " trailing", 0.0),  # ...but </answer> must end a line
        ("<think>reasoning</think><answer>42</answer>", 0.0),  # missing newlines
        ("Sure!\n" + WELL_FORMED, 0.0),  # must start at the beginning
        ("<think>\nreasoning\n</think>\n42", 0.0),  # no answer block
        ("<answer>\n42\n</answer>", 0.0),
    ],
)
def test_format(fmt, text, expected):
    assert R.REWARD_FUNCS["format"](as_format([text], fmt)) == [expected]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "text, expected",
    [
        (WELL_FORMED, 1.0),  # 4 tags x 0.25
        ("<think>\nreasoning\n</think>\n42", 0.5),  # "<think>\n" + "\n</think>\n"
        ("<think>\nreasoning\n</think>\n<answer>\n42</answer>", 0.75),  # no "\n" before </answer>
        # both think tags twice: 0; answer tags once each: 0.25 + 0.25
        ("<think>\na\n</think>\n<think>\nb\n</think>\n<answer>\n42\n</answer>", 0.5),
        ("<think>reasoning</think><answer>42</answer>", 0.0),  # no tag has its newlines
        ("", 0.0),
    ],
)
def test_tag_count(fmt, text, expected):
    assert R.tag_count(as_format([text], fmt)) == [expected]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "text, expected",
    [
        ("Step 1: a\nStep 2: b\nStep 3: c", 1.0),  # 3 markers / 3
        ("Step 1: a\nStep 2: b\nStep 3: c\nStep 4: d", 1.0),  # 4 / 3 capped at 1
        ("1. a\n2. b", 1 / 3),  # "N." counts only at the very start of the text, as open-r1
        ("First, a\n- b\n* c", 1.0),  # "First," + "\n-" + "\n*"
        ("Second, x. Finally, y.", 2 / 3),
        ("Step 10: x", 1 / 3),
        ("no steps at all", 0.0),
    ],
)
def test_reasoning_steps(fmt, text, expected):
    assert R.reasoning_steps(as_format([text], fmt)) == [pytest.approx(expected)]


# ------------------------------------------------------------------------------------------------ repetition


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "kwargs, text, expected",
    [
        # trigrams: (the cat sat) (cat sat the) (sat the cat) (the cat sat): 3 unique of 4 -> (1 - 3/4) * -1
        ({}, "the cat sat the cat sat", -0.25),
        ({}, "The cat sat THE CAT SAT", -0.25),  # words are lower-cased
        ({}, "a b c d", 0.0),  # no repeated trigram
        ({}, "a b", 0.0),  # fewer words than ngram_size
        ({}, "", 0.0),
        # bigrams: (to be) (be or) (or not) (not to) (to be): 4 unique of 5 -> (1 - 4/5) * -1
        ({"ngram_size": 2}, "to be or not to be", -0.2),
        # unigrams: 1 unique of 4 -> (1 - 1/4) * -0.5
        ({"ngram_size": 1, "max_penalty": -0.5}, "go go go go", -0.375),
    ],
)
def test_repetition_penalty_words(fmt, kwargs, text, expected):
    reward = R.repetition_penalty(**kwargs)
    assert reward.__name__ == "repetition_penalty"
    assert reward(completions=as_format([text], fmt)) == [pytest.approx(expected)]


def test_repetition_penalty_tokens():
    reward = R.get_repetition_penalty_reward(ngram_size=3, max_penalty=-1.0)
    assert reward.__name__ == "repetition_penalty_reward"
    # [1,2,3,1,2,3]: trigrams 123 231 312 123 -> 3 unique of 4 -> -0.25; [7,7] is shorter than 3 -> 0.0
    rows = [[1, 2, 3, 1, 2, 3], [7, 7], [1, 2, 3, 4]]
    assert reward(completions=["x"] * 3, completion_ids=rows) == [-0.25, 0.0, 0.0]
    assert reward(rows) == [-0.25, 0.0, 0.0]  # TRL's positional form


@pytest.mark.parametrize(
    "factory, kwargs",
    [
        (R.repetition_penalty, {"max_penalty": 0.5}),
        (R.repetition_penalty, {"ngram_size": 0}),
        (R.repetition_penalty, {"ngram_size": 2.5}),
        (R.get_repetition_penalty_reward, {"max_penalty": 1}),
    ],
)
def test_repetition_penalty_bad_params(factory, kwargs):
    with pytest.raises(ValueError):
        factory(**kwargs)


# ------------------------------------------------------------------------------------------------ soft overlong


@pytest.mark.parametrize("factory", ["soft_overlong_punishment", "get_soft_overlong_punishment"])
@pytest.mark.parametrize(
    "n_tokens, expected",
    [
        (0, 0.0),
        (80, 0.0),  # L - C = 100 - 20 = 80: still no penalty
        (81, -0.05),  # (80 - 81) / 20
        (90, -0.5),  # (80 - 90) / 20
        (100, -1.0),  # (80 - 100) / 20, the end of the window
        (101, -1.0),  # beyond L
        (1000, -1.0),
    ],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_soft_overlong_punishment(factory, n_tokens, expected, fmt):
    reward = R.REWARD_FACTORIES[factory](max_completion_len=100, soft_punish_cache=20)
    completions = as_format(["x"], fmt)
    assert reward(prompts=["p"], completions=completions, completion_ids=[[5] * n_tokens]) == [pytest.approx(expected)]


def test_soft_overlong_punishment_zero_cache_and_errors():
    reward = R.soft_overlong_punishment(max_completion_len=100, soft_punish_cache=0)
    assert reward(completion_ids=[[0] * 100, [0] * 101]) == [0.0, -1.0]  # no window: a step at L
    assert R.soft_overlong_punishment().params == {"max_completion_len": 16384, "soft_punish_cache": 4096}
    with pytest.raises(ValueError, match="soft_punish_cache"):
        R.soft_overlong_punishment(max_completion_len=10, soft_punish_cache=20)
    with pytest.raises(ValueError, match="max_completion_len"):
        R.get_soft_overlong_punishment(True, 1)
    with pytest.raises(ValueError, match="completion_ids"):
        reward(completions=["x"])
    with pytest.raises(ValueError, match="1 completions"):
        reward(completions=["x"], completion_ids=[[0], [0]])


# ------------------------------------------------------------------------------------------------ math rewards, fake checker


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["accuracy_reward", "accuracy"])
def test_accuracy_logic(fake_checker, fmt, name):
    texts = [r"\boxed{2}", r"\boxed{3}", "no box", r"\boxed{2}"]
    rewards = R.REWARD_FUNCS[name](as_format(texts, fmt), solution=["2", "2", "2", "???"], trainer_state=object())
    assert rewards == [1.0, 0.0, 0.0, None]  # correct, wrong, no answer, unparsable gold -> skipped


@pytest.mark.parametrize("fmt", FORMATS)
def test_reasoning_accuracy_logic(fake_checker, fmt):
    texts = [
        r"<think>\boxed{3}</think>\boxed{2}",  # only the part after </think> counts
        r"<think>\boxed{2}",  # unfinished reasoning -> 0.0, even if right
        r"<think>\boxed{2}</think> no answer",
        r"<think>a</think>b</think>\boxed{2}",  # after the last delimiter
        r"<think>a</think>\boxed{2}",  # unparsable gold -> None
    ]
    logged = {}
    rewards = R.reasoning_accuracy_reward(
        as_format(texts, fmt), solution=["2", "2", "2", "2", "???"], log_extra=logged.__setitem__
    )
    assert rewards == [1.0, 0.0, 0.0, 1.0, None]
    assert logged["solution"] == ["2", "2", "2", "2", "???"]
    assert logged["gold_parsed"][1] == "[incomplete reasoning]" and logged["answer_parsed"][4] == "[skipped]"
    custom = R.reasoning_accuracy_reward([r"\boxed{3} Answer: \boxed{2}"], ["2"], reasoning_delimiters=["Answer:"])
    assert custom == [1.0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_cosine_length_scaling(fake_checker, fmt):
    reward = R.cosine(max_len=20)
    assert reward.__name__ == "cosine"
    right, wrong = r"\boxed{2}", r"\boxed{3}"  # 9 characters each; gold "2"
    texts = [
        right.ljust(10),  # p = 10/20 = 0.5: 0.5 + 0.5 * (1.0 - 0.5) * (1 + cos(pi/2)) = 0.75
        right.ljust(20),  # p = 1: min_value_correct = 0.5
        right.ljust(40),  # p = 2 clamped to 1: 0.5 (open-r1's unclamped cos(2 pi) would give 1.0)
        wrong.ljust(10),  # p = 0.5: -0.5 + 0.5 * (-1.0 + 0.5) * (1 + 0) = -0.75
        "",  # p = 0, no answer (wrong): min_value_wrong = -1.0
        wrong.ljust(20),  # p = 1: max_value_wrong = -0.5
        right,  # unparsable gold: None
    ]
    solution = ["2"] * 6 + ["???"]
    expected = [0.75, 0.5, 0.5, -0.75, -1.0, -0.5, None]
    assert reward(as_format(texts, fmt), solution=solution) == [pytest.approx(e) if e else e for e in expected]
    # p = 9/36 = 0.25: 0.5 + 0.25 * (1 + cos(pi/4)) = 0.5 + 0.25 * 1.70711 = 0.92678
    assert R.cosine(max_len=36)([right], ["2"]) == [pytest.approx(0.5 + 0.25 * (1 + math.sqrt(0.5)))]
    custom = R.cosine(min_value_correct=0.0, max_value_correct=2.0, max_len=20)
    assert custom([right.ljust(10)], ["2"]) == [pytest.approx(1.0)]  # 0 + 0.5 * 2 * (1 + 0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cosine_scaled_reward_tokens(fake_checker, fmt):
    reward = R.get_cosine_scaled_reward(max_len=10)
    assert reward.__name__ == "cosine_scaled_reward"
    texts = as_format([r"\boxed{2}"] * 4 + [r"\boxed{3}"] * 4, fmt)
    ids = [[0] * n for n in (0, 5, 10, 15)] * 2  # p = 0, 0.5, 1, 1 (clamped)
    expected = [1.0, 0.75, 0.5, 0.5, -1.0, -0.75, -0.5, -0.5]
    assert reward(completions=texts, solution=["2"] * 8, completion_ids=ids) == pytest.approx(expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_length_reward(fake_checker, fmt):
    right, wrong = r"\boxed{2}", r"\boxed{3}"  # 9 characters
    texts = [right, right.ljust(20), wrong.ljust(14), wrong, right.ljust(11), wrong.ljust(20)]
    solution = ["2", "2", "2", "2", "???", "2"]
    # min_len 9, max_len 20; lam = 0.5 - (len - 9) / 11
    expected = [
        0.5,  # correct, len 9: lam = 0.5
        -0.5,  # correct, len 20: lam = 0.5 - 1
        0.0,  # wrong, len 14: min(0, 0.5 - 5/11 = 0.045)
        0.0,  # wrong, len 9: min(0, 0.5)
        None,  # unparsable gold
        -0.5,  # wrong, len 20: min(0, -0.5)
    ]
    rewards = R.length(as_format(texts, fmt), solution=solution)
    assert rewards == [pytest.approx(e) if e is not None else None for e in expected]
    assert R.length([right, wrong], solution=["2", "2"]) == [0.0, 0.0]  # equal lengths


def test_math_rewards_need_solution(fake_checker):
    with pytest.raises(ValueError, match="solution"):
        R.accuracy_reward(["x"])
    with pytest.raises(ValueError, match="2 `solution` values for 1"):
        R.accuracy(["x"], solution=["1", "2"])
    with pytest.raises(ValueError, match="math_timeout"):
        R.accuracy(["x"], solution=["1"], math_timeout=0)


def test_math_timeout_off_the_main_thread(monkeypatch):
    release = threading.Event()

    def load(flavor, reward):
        def hang_on_gold(solution):
            if solution == "slow":
                release.wait(10)
            return [solution]

        def hang_on_answer(text):
            if text == "slow":
                release.wait(10)
            return [text]

        return _math.Checker(hang_on_gold, hang_on_answer, lambda gold, answer: gold == answer)

    monkeypatch.setattr(_math, "load_checker", load)
    try:
        start = time.monotonic()
        with ThreadPoolExecutor(1) as pool:  # signal-based timeouts would fail here
            rewards = pool.submit(
                R.accuracy_reward, ["slow", "1", "1"], solution=["1", "slow", "1"], math_timeout=0.05
            ).result()
        # a hanging answer is wrong; a hanging gold solution is skipped; the rest is graded
        assert rewards == [0.0, None, 1.0]
        assert time.monotonic() - start < 5
    finally:
        release.set()


def test_missing_math_verify_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    with pytest.raises(R.MathVerifyNotInstalledError) as info:
        R.accuracy(["x"], solution=["1"])
    assert isinstance(info.value, ImportError)
    message = str(info.value)
    assert "pip install 'grpokit[math]'" in message and "\n" not in message and "'accuracy'" in message


# ------------------------------------------------------------------------------------------------ math-verify, end to end


@pytest.fixture
def math_verify():
    return pytest.importorskip("math_verify")


@pytest.mark.parametrize("fmt", FORMATS)
def test_accuracy_reward_math_verify(math_verify, fmt):
    texts = [
        r"My answer is \boxed{\frac{1}{3}}",
        r"My answer is \boxed{\frac{1}{2}}",
        "The answer is 1/3",  # no LaTeX anchor: no answer extracted
        r"\boxed{\frac{2}{6}}",  # equal value
        r"\boxed{1}",
    ]
    solution = [r"\frac{1}{3}"] * 4 + ["not math at all"]
    assert R.accuracy_reward(as_format(texts, fmt), solution=solution) == [1.0, 0.0, 0.0, 1.0, None]


@pytest.mark.parametrize("fmt", FORMATS)
def test_openr1_accuracy_math_verify(math_verify, fmt):
    texts = [r"$\boxed{\frac{1}{3}}$", r"$\boxed{0.5}$", r"\boxed{42}", r"\boxed{1}"]
    solution = [r"$\frac{1}{3}$", r"$\frac{1}{3}$", "42", "not math at all"]  # "42" has no LaTeX: fallback parse
    assert R.accuracy(as_format(texts, fmt), solution=solution) == [1.0, 0.0, 1.0, None]


def test_reasoning_accuracy_and_cosine_math_verify(math_verify):
    texts = [r"<think>maybe \boxed{2}</think> so \boxed{\frac{1}{3}}", r"<think>\boxed{\frac{1}{3}}"]
    assert R.reasoning_accuracy_reward(texts, solution=[r"\frac{1}{3}"] * 2) == [1.0, 0.0]
    reward = R.resolve_reward({"name": "cosine", "kwargs": {"max_len": 18}})
    # "\boxed{2}" is 9 characters: p = 0.5 -> 0.75 correct, -0.75 wrong
    assert reward([r"\boxed{2}", r"\boxed{3}"], solution=["$2$", "$2$"]) == pytest.approx([0.75, -0.75])


def test_math_verify_off_the_main_thread(math_verify):
    texts = [r"\boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}"]
    with ThreadPoolExecutor(2) as pool:
        results = [
            pool.submit(R.REWARD_FUNCS[n], texts, solution=[r"\frac{1}{3}"] * 2) for n in ("accuracy", "length")
        ]
        assert results[0].result() == [1.0, 0.0]
        assert results[1].result() == [0.0, 0.0]  # equal lengths


# ------------------------------------------------------------------------------------------------ registry


def test_registry_contents_and_names():
    names = R.reward_names()
    for name in [
        "accuracy_reward",
        "reasoning_accuracy_reward",
        "think_format_reward",
        "get_soft_overlong_punishment",
        "accuracy",
        "format",
        "tag_count",
        "reasoning_steps",
        "cosine",
        "repetition_penalty",
        "length",
        "soft_overlong_punishment",
    ]:
        assert name in names
    assert names == sorted(set(R.REWARD_FUNCS) | set(R.REWARD_FACTORIES))
    assert not set(R.REWARD_FUNCS) & set(R.REWARD_FACTORIES)
    for name, fn in R.REWARD_FUNCS.items():
        assert fn.__name__ == name and fn.__doc__ and ">>>" in fn.__doc__
    for name, factory in R.REWARD_FACTORIES.items():
        assert factory.__doc__ and ">>>" in factory.__doc__
        defaults = {"max_completion_len": 64, "soft_punish_cache": 8, "max_len": 64, "ioi_provider": "local"}
        reward = R.resolve_reward(name, defaults=defaults)  # ioi_code's default provider (piston) is refused
        assert isinstance(reward.__name__, str) and reward.__name__
    assert set(R.MATH_REWARD_NAMES) <= set(names)


def test_builtins_ignore_unknown_kwargs():
    extra = {"prompts": ["p"], "trainer_state": object(), "some_column": [1], "log_metric": print}
    assert R.think_format_reward(completions=["<think>a</think>"], completion_ids=[[1]], **extra) == [1.0]
    assert R.resolve_reward("format")(completions=["x"], **extra) == [0.0]
    assert R.resolve_reward("repetition_penalty")(completions=["x"], completion_ids=[[1]], **extra) == [0.0]


@pytest.mark.parametrize("completions", ["a string", [42], [[{"content": 3}]], None])
def test_bad_completions(completions):
    with pytest.raises(ValueError):
        R.tag_count(completions)


def test_resolve_name_and_defaults():
    assert R.resolve_reward("tag_count") is R.tag_count
    reward = R.resolve_reward("soft_overlong_punishment", defaults={"max_completion_len": 100, "unrelated": 1})
    assert reward.params == {"max_completion_len": 100, "soft_punish_cache": 25}  # cache: a quarter by default
    assert reward(completion_ids=[[0] * 75, [0] * 80]) == [0.0, -0.2]  # (75 - 80) / 25
    # kwargs win over config defaults
    spec = {"name": "soft_overlong_punishment", "kwargs": {"max_completion_len": 50, "soft_punish_cache": 10}}
    reward = R.resolve_reward(spec, defaults={"max_completion_len": 100})
    assert reward(completion_ids=[[0] * 45]) == [-0.5]  # (40 - 45) / 10
    # TRL's factory has no defaults of its own: the config can supply them
    reward = R.resolve_reward(
        "get_soft_overlong_punishment", defaults={"max_completion_len": 10, "soft_punish_cache": 2}
    )
    assert reward.__name__ == "soft_overlong_punishment_reward"
    with pytest.raises(ValueError, match="missing required kwarg.*soft_punish_cache"):
        R.resolve_reward("get_soft_overlong_punishment", defaults={"max_completion_len": 10})


def test_resolve_mapping_kwargs():
    reward = R.resolve_reward({"name": "cosine", "kwargs": {"max_len": 50, "min_value_wrong": -2}})
    assert reward.__name__ == "cosine" and reward.params["max_len"] == 50 and reward.params["min_value_wrong"] == -2
    bound = R.resolve_reward({"name": "reasoning_accuracy_reward", "kwargs": {"reasoning_delimiters": ["Answer:"]}})
    assert bound.__name__ == "reasoning_accuracy_reward" and bound.keywords == {"reasoning_delimiters": ["Answer:"]}
    assert R.resolve_reward({"name": "format"}) is R.format_reward  # kwargs optional
    for spec in (reward, bound, R.resolve_reward("format"), R.resolve_reward("soft_overlong_punishment")):
        clone = pickle.loads(pickle.dumps(spec))  # picklable for worker processes
        assert clone.__name__ == spec.__name__


@pytest.mark.parametrize(
    "spec, error",
    [
        ({"name": "cosine", "kwargs": {"max_lenght": 10}}, "unknown kwarg 'max_lenght'; did you mean 'max_len'"),
        ({"name": "cosine", "kwargs": {"max_len": "long"}}, "`max_len` must be an int"),
        ({"name": "format", "kwargs": {"strict": True}}, "unknown kwarg 'strict'"),
        ({"name": "format", "kwargs": {"completions": []}}, "cannot set 'completions'"),
        ({"name": "cosine", "kwarg": {}}, "unknown key 'kwarg'; did you mean 'kwargs'"),
        ({"name": "cosine", "kwargs": [1]}, "'kwargs' must be a mapping"),
        ({"kwargs": {}}, "needs a 'name'"),
        (42, "a reward spec is a name"),
    ],
)
def test_resolve_errors(spec, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        R.resolve_reward(spec)
    message = R.check_reward_spec(spec)
    assert error in message and "\n" not in message


def test_resolve_dotted_paths(helpers_on_path):
    assert R.resolve_reward("os.path.join") is os.path.join  # importable: resolution only imports
    assert R.check_reward_spec("os.path.join") is None
    assert R.resolve_reward("_reward_helpers.always_one")(completions=["a", "b"]) == [1.0, 1.0]
    scaled = R.resolve_reward({"name": "_reward_helpers.scaled", "kwargs": {"scale": 0.5}})  # partial
    assert scaled.__name__ == "scaled" and scaled(completions=["a"]) == [0.5]
    made = R.resolve_reward({"name": "_reward_helpers.make_constant", "kwargs": {"value": 2.0}})  # factory
    assert made.__name__ == "constant_reward" and made(completions=["a"]) == [2.0]
    instance = R.resolve_reward({"name": "_reward_helpers.ConstantReward", "kwargs": {"value": 3.0}})
    assert instance.__name__ == "ConstantReward" and instance(completions=["a"]) == [3.0]
    assert R.resolve_reward("grpokit.rewards.tag_count") is R.tag_count


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("acuracy", "reward 'acuracy': unknown reward name; did you mean 'accuracy'?"),
        ("tag-count", "did you mean 'tag_count'?"),
        ("Format", "did you mean 'format'?"),
        ("soft_overlong_punishement", "did you mean 'soft_overlong_punishment'?"),
        ("zzzz", "built-ins: accuracy, accuracy_reward"),
        ("os.path.jion", "reward 'os.path.jion': module 'os.path' has no attribute 'jion'; did you mean 'join'?"),
        ("no_such_package_xyz.mod.fn", "cannot import module 'no_such_package_xyz'"),
        ("os.no_such_module_xyz.fn", "module 'os' has no attribute 'no_such_module_xyz'"),
        ("_reward_helpers.NOT_CALLABLE", "int object is not callable"),
        ("_reward_helpers_broken.reward", "importing module '_reward_helpers_broken' failed: ModuleNotFoundError"),
        ({"name": "_reward_helpers.make_constant", "kwargs": {"valeu": 1}}, "did you mean 'value'"),
        ({"name": "_reward_helpers.make_constant"}, "missing required kwarg(s) value"),
        ("1bad..path", "not a valid dotted path"),
    ],
)
def test_check_reward_spec_messages(helpers_on_path, spec, expected):
    message = R.check_reward_spec(spec)
    assert message is not None and expected in message and "\n" not in message


@pytest.mark.parametrize(
    "spec",
    [
        "accuracy",
        "think_format_reward",
        "cosine",
        {"name": "repetition_penalty", "kwargs": {"ngram_size": 4, "max_penalty": -0.5}},
        {"name": "get_cosine_scaled_reward", "kwargs": {"max_len": 100}},
        {"name": "reasoning_accuracy_reward", "kwargs": {"math_timeout": 5}},
    ],
)
def test_check_reward_spec_ok(spec):
    assert R.check_reward_spec(spec) is None


def test_import_is_cheap():
    code = "import sys, grpokit.rewards; print(sorted(m for m in ('torch', 'transformers', 'math_verify') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------------------------------------ docstring examples

_DOCTESTS = [
    test
    for module in (trl_rewards, openr1_rewards, registry)
    for test in doctest.DocTestFinder().find(module)
    if test.examples
]


@pytest.mark.parametrize("test", _DOCTESTS, ids=[t.name.rsplit(".", 1)[-1] for t in _DOCTESTS])
def test_docstring_examples(test):
    if any(word in test.name for word in ("accuracy", "cosine", "length")):
        pytest.importorskip("math_verify")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
