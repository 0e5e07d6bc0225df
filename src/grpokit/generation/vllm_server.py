"""Generation by a separate `vllm serve` process (`vllm_mode: server`), started with `grpokit vllm-serve MODEL`.

Completions come from the server's OpenAI-compatible `/v1/completions` (prompts as token ids, the sampled token
ids and their logprobs back, nothing detokenized and re-tokenized). Weights go in through vLLM's weight-transfer
routes: grpokit's `gloo` engine (`vllm_gloo.py`) on a CPU server, vLLM's `nccl` engine on a CUDA one; the server's
configured backend decides.

Only the main process talks to the server; the others hand it their prompts (`gather_object`) and take their rows
of the answer (`broadcast_object`), and every error reaches every process, so all raise the same one instead of
some waiting forever in a collective.

Image prompts (vision-language models) go to the server's token-in/token-out route `/inference/v1/generate`
(mounted by `vllm serve --enable-scale-out`, which `grpokit vllm-serve` passes): the prompt's tokens with each image
still one placeholder, and the images as data URLs; the server expands the placeholders with its own processor and
its answer's prompt tokens must equal the trainer's processor's (checked).

The logprobs returned are the server's: they are the sampling distribution's (after temperature) only when the
server runs with `--logprobs-mode processed_logprobs` (which `grpokit vllm-serve` passes). That cannot be seen in a
completion, so the server's configuration is checked once, at construction, through `/server_info`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

from ..dist import LOCAL, Collective
from .base import Generated, GenerationError
from .tokens import cut_after_eos
from .vllm_auth import auth_headers
from .vllm_common import LOGPROBS_MODE, dense_dtype, local_address_towards, policy_weights, vllm_name

logger = logging.getLogger(__name__)

SERVE_HINT = "grpokit vllm-serve MODEL"
_DEV_FLAGS = 'VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config \'{"backend": "gloo"}\' (or nccl on CUDA)'


def _image_rows(vision, rows: int) -> list:
    """Per row: None, or (unexpanded prompt ids, the images as PNG data URLs) for a row with images."""
    if vision is None:
        return [None] * rows
    return [
        (list(p.token_ids), [_data_url(image) for image in p.images]) if p is not None and p.images else None
        for p in vision.engine_prompts
    ]


def _data_url(image) -> str:
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class VLLMServerError(GenerationError):
    """A one-line error about the vLLM server (unreachable, wrong model, missing flags, died mid-run)."""


def wait_for_server(base_url: str, timeout: float) -> None:
    """Return once `base_url`/health answers 200; a one-line `VLLMServerError` after `timeout` seconds."""
    base_url = base_url.rstrip("/")
    deadline = time.monotonic() + timeout
    while True:
        try:
            health = urllib.request.Request(base_url + "/health", headers=auth_headers())
            with urllib.request.urlopen(health, timeout=min(5.0, timeout)) as response:
                if response.status == 200:
                    return
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            raise VLLMServerError(
                f"no vLLM server answered at {base_url} within {timeout:g}s: start one with `{SERVE_HINT}` (on that "
                f"host and port), or point vllm_server_base_url / vllm_server_host and vllm_server_port at it"
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


class VLLMServerGenerator:
    """Completions and weight pushes against one `vllm serve` at `base_url`."""

    def __init__(
        self,
        *,
        base_url: str,
        timeout: float,
        group_port: int,
        sampling: dict,
        num_generations: int,
        eos_token_ids: list[int],
        model_name: str | None = None,
        dist: Collective = LOCAL,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.group_port = group_port
        self.sampling = dict(sampling)
        self.num_generations = num_generations
        self.eos_token_ids = list(eos_token_ids)
        self.model_name = model_name
        self.dist = dist
        self.last_sync_seconds: float | None = None
        self.request_timeout: float | None = None  # seconds one generation request may take (None: no limit)
        self.weight_timeout: float | None = None  # seconds one weight-transfer request may take (None: no limit)
        self._transfer = None  # trainer-side weight-transfer engine, created at the first push
        self._source = None  # the policy as a vLLM `WeightSource`
        # LoRA adapter-only sync (vllm_lora.py): decided at the first push; the trainer may set where adapters are
        # written, how many versions stay loaded and the version to carry on from (a resumed run)
        self.adapter_sync = True  # False: a LoRA policy is always pushed merged
        self.adapter_root: str | None = None
        self.adapter_keep = 1
        self.adapter_version_start = 0
        self._adapters = None  # AdapterVersions when the adapter alone is pushed
        self._adapter_decided = False
        self.last_sync_bytes = 0
        info = None
        if dist.process_index == 0:
            try:
                info = ("ok", self._connect())
            except VLLMServerError as exc:
                info = ("error", str(exc))
            except Exception as exc:  # noqa: BLE001 - every process must raise it, not wait in broadcast_object
                info = ("error", f"checking the vLLM server at {self.base_url} failed: {_one_line(exc)}")
        status, value = dist.broadcast_object(info)
        if status == "error":
            raise VLLMServerError(value)
        self.served_model, self.backend, self.world_size, self.lora_config = value

    # -- connection checks (main process) --------------------------------------------------------------------

    def _connect(self) -> tuple[str, str, int]:
        self._wait_healthy()
        served, root = self._served_model()
        if self.model_name is not None and not _same_model(self.model_name, served, root):
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} serves {served!r}, not the policy model {self.model_name!r}: "
                f"start it with `grpokit vllm-serve {self.model_name}`"
            )
        config = self._server_config()
        transfer = config.get("weight_transfer_config") or {}
        backend = transfer.get("backend") if isinstance(transfer, dict) else None
        if not backend:
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} has no weight-transfer engine: restart it with "
                f"{_DEV_FLAGS} (`{SERVE_HINT}` sets them)"
            )
        logprobs_mode = (config.get("model_config") or {}).get("logprobs_mode")
        if logprobs_mode is not None and logprobs_mode != LOGPROBS_MODE:
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} reports {logprobs_mode} logprobs: restart it with "
                f"--logprobs-mode {LOGPROBS_MODE} (`{SERVE_HINT}` sets it)"
            )
        world_size = int(self._request("GET", "/get_world_size")["world_size"])
        lora = config.get("lora_config")
        return served, backend, world_size, lora if isinstance(lora, dict) else None

    def _wait_healthy(self) -> None:
        wait_for_server(self.base_url, self.timeout)

    def _served_model(self) -> tuple[str, str | None]:
        models = self._request("GET", "/v1/models").get("data") or []
        if not models:
            raise VLLMServerError(f"the vLLM server at {self.base_url} lists no model at /v1/models")
        return models[0]["id"], models[0].get("root")

    def _server_config(self) -> dict:
        info = self._request("GET", "/server_info?config_format=json", missing_ok=True)
        if info is None:
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} has no weight-sync endpoints (/server_info is missing): "
                f"restart it with {_DEV_FLAGS} (`{SERVE_HINT}` sets them)"
            )
        config = info.get("vllm_config")
        return config if isinstance(config, dict) else {}

    # -- generation ------------------------------------------------------------------------------------------

    def generate(self, prompt_ids: list[list[int]], vision=None) -> Generated:
        """Completions for this process's rows; called on every process, rows repeated `num_generations` times.
        A vision-language model's rows with images (`vision`) go to `/inference/v1/generate`."""
        local = [list(map(int, p)) for p in prompt_ids]
        pictures = _image_rows(vision, len(local))
        per_process = self.dist.gather_object([(local, pictures)])
        result = None
        if self.dist.process_index == 0:
            try:
                rows = [row for ids, _ in per_process for row in ids]
                images = [row for _, extra in per_process for row in extra]
                if any(image is not None for image in images):
                    result = ("ok", self._complete_images(rows, images))
                else:
                    result = ("ok", self._complete(rows))
            except (VLLMServerError, ValueError) as exc:
                result = ("error", str(exc), type(exc).__name__)
            except Exception as exc:  # noqa: BLE001 - every process must raise it, not wait in broadcast_object
                result = ("error", f"generating with the vLLM server at {self.base_url} failed: {_one_line(exc)}", "")
        result = self.dist.broadcast_object(result)
        if result[0] == "error":
            raise (ValueError if result[2] == "ValueError" else VLLMServerError)(result[1])
        rows = result[1]
        start = sum(len(p) for p, _ in per_process[: self.dist.process_index])
        mine = rows[start : start + len(local)]
        return Generated([ids for ids, _ in mine], [lps for _, lps in mine])

    def _complete(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """(completion ids, logprobs) for every row of `prompts`, in order. Rows in whole groups of one prompt
        repeated `num_generations` times (a first turn) are asked once per group with n = num_generations; any other
        rows (the turns of the tool loop: one sequence per rollout) are asked one completion each."""
        g = self.num_generations
        grouped = len(prompts) % g == 0 and all(prompts[i] == prompts[i - i % g] for i in range(len(prompts)))
        group = g if grouped else 1
        distinct = prompts[::group]
        if not distinct:
            return []
        body = {key: value for key, value in self.sampling.items() if value is not None}
        # vLLM refuses n > 1 with greedy sampling; every greedy sample is the same, so ask for one and repeat it.
        greedy = body.get("temperature") == 0
        n = 1 if greedy else group
        body.update(model=self.request_model, prompt=distinct, n=n, logprobs=0, return_token_ids=True, stream=False)
        response = self._request("POST", "/v1/completions", body, read_timeout=self.request_timeout)
        choices = response.get("choices") or []
        if len(choices) != len(distinct) * n:
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} returned {len(choices)} completions for "
                f"{len(distinct)} prompts x n={n}"
            )
        if greedy:
            choices = [choice for choice in sorted(choices, key=lambda c: c["index"]) for _ in range(group)]
        else:
            choices = sorted(choices, key=lambda c: c["index"])
        rows = []
        for choice in choices:
            ids = choice.get("token_ids")
            if ids is None:
                raise VLLMServerError(
                    f"the vLLM server at {self.base_url} returned no token_ids (return_token_ids is not supported; "
                    f"vLLM >= 0.10.2 is needed)"
                )
            logprobs = [
                float(x) if x is not None else 0.0 for x in (choice.get("logprobs") or {}).get("token_logprobs") or []
            ]
            ids = cut_after_eos(ids, self.eos_token_ids)
            rows.append((ids, logprobs[: len(ids)]))
        return rows

    def _complete_images(self, prompts: list[list[int]], images: list) -> list[tuple[list[int], list[float]]]:
        """(completion ids, logprobs) for every row, image rows through `/inference/v1/generate`: one request per
        run of identical rows (a prompt's group), n = the run's length; the requests run together."""
        from concurrent.futures import ThreadPoolExecutor

        runs = []  # (first row, length)
        for i, (ids, image) in enumerate(zip(prompts, images, strict=True)):
            if runs and i - runs[-1][0] < self.num_generations:
                first = runs[-1][0]
                if prompts[first] == ids and images[first] == image and i == sum(runs[-1]):
                    runs[-1] = (first, runs[-1][1] + 1)
                    continue
            runs.append((i, 1))
        with ThreadPoolExecutor(max_workers=min(32, len(runs))) as pool:
            answers = list(pool.map(lambda run: self._generate_tokens(prompts[run[0]], images[run[0]], run[1]), runs))
        return [row for answer in answers for row in answer]

    def _generate_tokens(self, ids: list[int], image, n: int) -> list[tuple[list[int], list[float]]]:
        body = {k: v for k, v in self.sampling.items() if v is not None}
        greedy = body.get("temperature") == 0
        body.update(n=1 if greedy else n, logprobs=0)
        if image is None:  # a text row of a batch with images
            request = {"token_ids": ids, "sampling_params": body, "model": self.request_model}
        else:
            engine_ids, urls = image
            request = {
                "token_ids": engine_ids,
                "content_parts": [{"type": "image_url", "url": url} for url in urls],
                "sampling_params": body,
                "model": self.request_model,
                "return_token_ids": True,
            }
        response = self._request(
            "POST", "/inference/v1/generate", request, read_timeout=self.request_timeout, missing_ok=True
        )
        if response is None:
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} has no /inference/v1/generate route, which image prompts need: "
                f"restart it with --enable-scale-out (`{SERVE_HINT}` passes it)"
            )
        served = response.get("prompt_token_ids")
        if image is not None and served is not None and list(served) != ids:
            raise VLLMServerError(
                f"the vLLM server encoded an image prompt as {len(served)} tokens where the trainer's processor gives "
                f"{len(ids)}: its processor settings differ from the trainer's, and training would score other "
                "tokens than it saw"
            )
        rows = []
        for choice in sorted(response.get("choices") or [], key=lambda c: c["index"]):
            content = (choice.get("logprobs") or {}).get("content") or []
            token_ids = cut_after_eos(list(choice.get("token_ids") or []), self.eos_token_ids)
            logprobs = [float(entry["logprob"]) for entry in content][: len(token_ids)]
            rows.append((token_ids, logprobs))
        rows = rows * n if greedy else rows
        if len(rows) != n:
            raise VLLMServerError(f"the vLLM server at {self.base_url} returned {len(rows)} completions for n={n}")
        return rows

    # -- weights ---------------------------------------------------------------------------------------------

    def sync_weights(self, model) -> None:
        """Push `model`'s weights to the server (main process); every process returns or raises together."""
        error = None
        if self.dist.process_index == 0:
            start = time.perf_counter()
            try:
                self._push(model)
                self.last_sync_seconds = time.perf_counter() - start
            except Exception as exc:  # noqa: BLE001 - every process must learn of it
                reason = _one_line(exc)
                # A server error already names the server; say only what was being done.
                where = "" if isinstance(exc, VLLMServerError) else f" to the vLLM server at {self.base_url}"
                error = f"pushing weights{where} failed: {reason}"
                transfer, self._transfer = self._transfer, None  # a broken group is not reused
                if transfer is not None:
                    transfer.shutdown()
        error = self.dist.broadcast_object(error)
        if error is not None:
            raise VLLMServerError(error)

    @property
    def request_model(self) -> str:
        """The model a generation request names: the newest adapter pushed, else the served model."""
        return (self._adapters.current if self._adapters is not None else None) or self.served_model

    @property
    def pushes_adapters(self) -> bool:
        """Whether weight syncs load the LoRA adapter alone (requests in flight keep the adapter they named)."""
        return self._adapters is not None

    def _adapter_sync(self, model) -> bool:
        """Decided at the first push: the adapter alone when the policy's adapter and the server allow it; a LoRA
        policy that cannot be says why in one warning and is pushed merged."""
        from grpokit.models import is_peft_model
        from grpokit.sharding import is_sharded

        from . import vllm_lora

        self._adapter_decided = True
        if not self.adapter_sync or not is_peft_model(model):
            return False
        reason = vllm_lora.adapter_problem(model)
        if reason is None and is_sharded(model):
            reason = "the policy is sharded (ZeRO-3 / FSDP): its adapter is not gathered for saving"
        if reason is None:
            rank = vllm_lora.adapter_rank(model.peft_config[model.active_adapter])
            reason = vllm_lora.server_problem(self.lora_config, rank, self.adapter_keep + 1)
        if reason is not None:
            logger.warning(f"pushing merged weights to the vLLM server at {self.base_url}, not the adapter: {reason}")
            return False
        root = self.adapter_root or tempfile.mkdtemp(prefix="grpokit-adapters-")
        self._adapters = vllm_lora.AdapterVersions(
            lambda path, body: self._request("POST", path, body, read_timeout=self.weight_timeout, text=True),
            root,
            self.adapter_keep,
        )
        self._adapters.version = self.adapter_version_start
        return True

    def _push(self, model) -> None:
        if not self._adapter_decided:
            self._adapter_sync(model)
        if self._adapters is not None:
            self._adapters.push(model)
            self.last_sync_bytes = self._adapters.last_bytes
            return
        if self._transfer is None:
            self._source = _PolicySource(model)
            self._transfer = self._init_transfer(self._source)
        self._source.model = model
        self._transfer.send_weights()
        if not self.last_sync_bytes:  # the same every push: every weight, in its dtype
            metas = self._source.metadata()
            self.last_sync_bytes = sum(math.prod(m.shape) * m.dtype.itemsize for m in metas)
        # Cached prefixes hold keys and values computed with the old weights, cached image embeddings the old vision
        # tower's output.
        self._request("POST", "/reset_prefix_cache")
        self._request("POST", "/reset_encoder_cache")

    def _init_transfer(self, source):
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        host = urllib.parse.urlparse(self.base_url).hostname or "127.0.0.1"
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        client = _HTTPWeightSyncClient(self)
        if self.backend == "gloo":
            from .vllm_gloo import GlooTrainerInitInfo, register

            register()
            # The group's collectives give up when the push may (weight_sync_timeout), on both sides.
            timeout = {"timeout_s": float(self.weight_timeout)} if self.weight_timeout else {}
            init_info = GlooTrainerInitInfo(
                master_address=host, master_port=self.group_port, world_size=self.world_size + 1, rank=0, **timeout
            )
        elif self.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            # vLLM's NCCL rendezvous is hosted by the trainer (rank 0): give the workers this machine's address.
            init_info = NCCLTrainerInitInfo(
                master_address=local_address_towards(host, self.group_port),
                master_port=self.group_port,
                world_size=self.world_size + 1,
                rank=0,
            )
        else:
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} uses the {self.backend!r} weight-transfer backend; grpokit "
                f"pushes weights with 'gloo' or 'nccl'"
            )
        return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)

    def close(self) -> None:
        """Release the transfer group (the server can then take another trainer); the server keeps running."""
        transfer, self._transfer = self._transfer, None
        if transfer is None:
            return
        try:
            transfer.shutdown()
        finally:
            try:
                self._request("POST", "/shutdown_weight_transfer_engine", timeout=10.0)
            except VLLMServerError:
                pass

    # -- HTTP ------------------------------------------------------------------------------------------------

    def _request(self, method, path, body=None, *, missing_ok=False, timeout=None, read_timeout=-1.0, text=False):
        """JSON request; a one-line `VLLMServerError` on any failure (None for a 404 when `missing_ok`). `text`: the
        answer is plain text (vLLM's adapter routes), returned as it is."""
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **auth_headers()}  # the token of `grpokit vllm-serve`, if set
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        if timeout is None:
            timeout = max(self.timeout, 60.0) if read_timeout == -1.0 else read_timeout
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            if missing_ok and exc.code == 404:
                return None
            detail = _one_line(exc.read().decode(errors="replace"))[:500]
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} answered {path} with {exc.code}: {detail}"
            ) from None
        except (OSError, ValueError) as exc:
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} did not answer {path} ({_one_line(exc)}); is it still running?"
            ) from None
        if text:
            return payload.decode(errors="replace")
        return json.loads(payload) if payload else {}


class _HTTPWeightSyncClient:
    """vLLM's `VLLMWeightSyncClient` protocol over the server's weight-sync routes, with one-line errors."""

    def __init__(self, generator: VLLMServerGenerator):
        self.generator = generator

    def _post(self, path, body=None):
        self.generator._request("POST", path, body, read_timeout=self.generator.weight_timeout)

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self._post("/start_weight_update")

    def update_weights(self, update_info) -> None:
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post("/finish_weight_update", None if weight_version is None else {"weight_version": weight_version})


def _PolicySource(model):  # noqa: N802 - a class built on first use, so vLLM is imported only here
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class PolicySource(WeightSource):
        """The policy's weights as vLLM names them (`policy_weights`: LoRA merged); `model` is set before each
        push. `metadata()` reads names, dtypes and shapes without computing LoRA merges."""

        def __init__(self, model):
            self.model = model

        def metadata(self) -> list:
            from grpokit.models import QUANTIZED_PARAMS, dense_shape

            metas, seen, quantized_dtype = [], set(), dense_dtype(self.model)
            for name, param in self.model.named_parameters():
                target = vllm_name(name)
                if target is None or target in seen:
                    continue
                seen.add(target)
                dtype = quantized_dtype if type(param).__name__ in QUANTIZED_PARAMS else param.dtype
                metas.append(ParamMeta(target, dtype, dense_shape(param)))
            return metas

        def __iter__(self) -> Iterator:
            return policy_weights(self.model)

    return PolicySource(model)


def _same_model(expected: str, served: str, root: str | None) -> bool:
    names = {served, root} - {None}
    if expected in names:
        return True
    if os.path.exists(expected):
        real = os.path.realpath(expected)
        return any(os.path.exists(n) and os.path.realpath(n) == real for n in names)
    return False


def _one_line(exc) -> str:
    text = str(exc) if not isinstance(exc, BaseException) or str(exc) else type(exc).__name__
    return " ".join(text.split())
