"""open-r1's Codeforces recipe: `vllm_device: auto` is a warning (grpokit picks vLLM's device itself, as `auto`
asked), any other vllm_device stays an error; the `cf_code` reward is refused in one line that says why (its
checkers run only on open-r1's remote graders). Through `grpokit config validate`, in-process."""

import pytest

from grpokit.config.migrations import removed_key_is_error
from grpokit.rewards import check_reward_spec

AUTO_WARNING = (
    "warning: vllm_device ({src}) is removed in TRL 0.18: vLLM's device is chosen for you (as `auto` asked): each "
    "training process's own (vllm_mode: colocate) or a separate server's (vllm_mode: server, started with `grpokit "
    "vllm-serve` on the GPUs you choose); delete the key"
)
CF_CODE_WHY = (
    "reward 'cf_code': open-r1's Codeforces reward is not available by design: Codeforces problems are judged by "
    "their checker programs, which run only on open-r1's remote Piston/Morph graders (grpokit runs code locally and "
    "offline); binary_code (pass/fail) or code (pass fraction) score stdin/stdout tests in the local sandbox"
)


@pytest.mark.parametrize(
    "key, value, error",
    [
        ("vllm_device", "auto", False),
        ("vllm_device", " AUTO ", False),  # YAML and flags are compared as the user would read them
        ("vllm_device", "cuda:1", True),
        ("vllm_device", 1, True),
        ("vllm_dtype", "half", False),  # removed but harmless whatever its value
        ("vllm_max_model_len", 2048, False),  # renamed, not removed
        ("beta", 0.0, False),  # not a migration at all
    ],
)
def test_removed_key_is_error(key, value, error):
    assert removed_key_is_error(key, value) is error


def test_vllm_device_auto_is_a_warning(cli, write):
    path = write("cf.yaml", "use_vllm: true\nvllm_device: auto\n")
    result = cli("config", "validate", "--config", path)
    assert result.code == 0 and result.out == "ok\n", result.err
    assert AUTO_WARNING.format(src=f"yaml:{path}:2") in result.err.splitlines()
    assert result.errors == []


def test_vllm_device_auto_on_the_command_line_is_a_warning(cli):
    result = cli("config", "validate", "--use_vllm", "--vllm_device", "auto")
    assert result.code == 0 and AUTO_WARNING.format(src="cli") in result.err.splitlines()


@pytest.mark.parametrize("value", ["cuda:1", "cpu", "1"])
def test_other_vllm_device_values_stay_an_error(cli, write, value):
    path = write("cf.yaml", f"use_vllm: true\nvllm_device: '{value}'\n")
    result = cli("config", "validate", "--config", path)
    assert result.code == 2 and result.out == ""
    assert len(result.errors) == 1 and result.errors[0].startswith(
        f"error: vllm_device={value!r} (yaml:{path}:2): removed in TRL 0.18: "
    )


def test_cf_code_is_refused_in_one_line_that_says_why(cli, write):
    path = write("cf.yaml", "reward_funcs: [cf_code, code_format]\nreward_weights: [1.0, 0.1]\n")
    result = cli("config", "validate", "--config", path)
    assert result.code == 2 and result.out == ""
    assert result.errors == [f"error: reward_funcs (yaml:{path}:1): entry 0: {CF_CODE_WHY}"]
    assert "did you mean" not in result.err  # not "unknown reward name; did you mean 'code'?"


def test_cf_code_is_refused_in_a_mapping_too():
    assert check_reward_spec({"name": "cf_code", "kwargs": {"code_language": "cpp"}}) == CF_CODE_WHY


def test_the_codeforces_recipe_shape_fails_on_cf_code_alone(cli, write):
    # open-r1's Codeforces recipe keys that concern vLLM and rewards: cf_code is the one error (warnings are printed
    # only for a config that resolves), and the scoring mode of cf_code is refused with the same reason.
    path = write(
        "codeforces.yaml",
        "use_vllm: true\nvllm_device: auto\nvllm_mode: colocate\n"
        "reward_funcs: [cf_code, code_format]\nreward_weights: [1.0, 0.1]\ncode_eval_scoring_mode: partial\n",
    )
    result = cli("config", "validate", "--config", path)
    assert result.code == 2
    assert result.errors == [f"error: reward_funcs (yaml:{path}:4): entry 0: {CF_CODE_WHY}"]  # vllm_device: none
    without = write("codeforces2.yaml", "reward_funcs: [binary_code]\ncode_eval_scoring_mode: partial\n")
    refused = cli("config", "validate", "--config", without)
    assert refused.code == 2 and len(refused.errors) == 1
    assert refused.errors[0].startswith("error: code_eval_scoring_mode='partial': it scores open-r1's Codeforces")
    assert "checkers run only on open-r1's remote Piston/Morph graders" in refused.errors[0]
