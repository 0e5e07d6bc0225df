"""The Tinker API over HTTP (FastAPI, served by uvicorn): sessions, futures, and the engine's operations.

Each training or sampling call answers at once with a future (`{"request_id": ...}`) and queues its work on the
engine's one worker thread, in the order the calls arrive (the SDK sends a training client's calls in its own order,
one after the other). `retrieve_future` waits up to `LONG_POLL_S` for the work to finish, then answers "try again".
A failed operation answers `{"error": ..., "category": "user" | "server"}`, which the SDK raises as its own
`RequestFailedError` with that one line; the server goes on serving.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from . import wire
from .engine import Engine, LoraSpec, UserError
from .losses import LossInputError

logger = logging.getLogger("grpokit.tinker")

LONG_POLL_S = 20.0  # how long retrieve_future waits for a result before answering try_again (the SDK waits 45 s)
KEEP_DONE_S = 30 * 60  # a finished future's result is kept this long for retrieval
API = "/api/v1"
SUPPORTED_SDK = ">=0.34,<0.39"  # tinker SDK versions tested against this server (the oldest and the newest in CI)


class _Future:
    def __init__(self, task: asyncio.Future, proto: bool):
        self.task = task
        self.proto = proto  # its result is a (protobuf bytes, JSON dict) pair
        self.done_at: float | None = None


class TinkerService:
    """The server's state beside the engine: sessions, sampling sessions and futures."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpokit-engine")
        self.sessions: set[str] = set()
        self.samplers: dict[str, str | None] = {}  # sampling session id -> sampler path (None: the base model)
        self.sampler_clients: dict[str, itertools.count] = {}
        self.futures: dict[str, _Future] = {}
        self._ids = itertools.count(1)

    def submit(self, fn: Callable[[], Any], *, proto: bool = False) -> str:
        request_id = f"req-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        future = _Future(loop.run_in_executor(self.executor, fn), proto)
        future.task.add_done_callback(lambda _: setattr(future, "done_at", time.monotonic()))
        self.futures[request_id] = future
        self._prune()
        return request_id

    def _prune(self) -> None:
        now = time.monotonic()
        for key in [k for k, f in self.futures.items() if f.done_at is not None and now - f.done_at > KEEP_DONE_S]:
            del self.futures[key]

    def model_name_check(self, base_model: str | None) -> None:
        if base_model is not None and not self.engine.matches(base_model):
            raise UserError(f"base_model {base_model!r} is not served here; this server serves {self.engine.source!r}")


def _tested_sdk(version: str | None) -> bool:
    from packaging.specifiers import SpecifierSet

    return version is None or SpecifierSet(SUPPORTED_SDK).contains(version, prereleases=True)


def _failure(error: BaseException) -> dict:
    if isinstance(error, (UserError, LossInputError)):
        return {"error": str(error), "category": "user"}
    logger.error("request failed:\n%s", "".join(traceback.format_exception(error)))
    return {"error": f"{type(error).__name__}: {error}", "category": "server"}


def build_app(engine: Engine, *, api_key: str | None = None):
    """The ASGI application serving `engine` through the Tinker API; with `api_key`, every request must carry it
    (`X-API-Key`, compared in constant time)."""
    from tinker import types

    service = TinkerService(engine)
    app = FastAPI(title="grpokit Tinker server", docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if api_key is not None:
            given = request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return JSONResponse({"detail": "invalid or missing API key (X-API-Key)"}, status_code=401)
        return await call_next(request)

    @app.exception_handler(UserError)
    async def user_error(request: Request, error: UserError):
        return JSONResponse({"detail": str(error)}, status_code=400)

    async def parse(request: Request, model):
        try:
            return model.model_validate(await request.json())
        except Exception as e:  # noqa: BLE001 - pydantic's ValidationError or bad JSON: one line back
            first = str(e).strip().splitlines()
            raise UserError(f"bad {model.__name__}: {' '.join(first[:3])}") from None

    # -- service ------------------------------------------------------------------------------------------------------

    @app.get(f"{API}/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post(f"{API}/client/config")
    async def client_config():
        return {
            "pjwt_auth_enabled": False,
            "proto_compress_fwdbwd": True,
            "sample_use_retrieve_futures": False,
            "custom_loss_server_side": False,
            "sample_join_sampling_session": True,
        }

    @app.post(f"{API}/client/dynamic_config")
    async def client_dynamic_config():
        return {}

    @app.post(f"{API}/telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @app.get(f"{API}/get_server_capabilities")
    async def capabilities():
        return {
            "supported_models": [
                {
                    "model_name": engine.name,
                    "max_context_length": engine.max_length,
                    "trainable": True,
                    "sampleable": True,
                }
            ]
        }

    @app.post(f"{API}/create_session")
    async def create_session(request: Request):
        body = await parse(request, types.CreateSessionRequest)
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        service.sessions.add(session_id)
        answer = {
            "type": "create_session",
            "session_id": session_id,
            "info_message": f"grpokit serves {engine.source}",
        }
        if not _tested_sdk(body.sdk_version):
            answer["warning_message"] = (
                f"tinker SDK {body.sdk_version} is outside the versions grpokit's server is tested with ({SUPPORTED_SDK})"
            )
        return answer

    @app.post(f"{API}/session_heartbeat")
    async def heartbeat(request: Request):
        body = await parse(request, types.SessionHeartbeatRequest)
        if body.session_id not in service.sessions:
            raise UserError(f"unknown session {body.session_id!r}")
        return {"type": "session_heartbeat"}

    # -- training clients ---------------------------------------------------------------------------------------------

    @app.post(f"{API}/create_model")
    async def create_model(request: Request):
        body = await parse(request, types.CreateModelRequest)
        model_id = f"{body.session_id}:train:{body.model_seq_id}"

        def run():
            service.model_name_check(body.base_model)
            if body.lora_config is None:
                raise UserError("only LoRA training clients are served (create_lora_training_client)")
            if body.optimizer_config.type != "adamw":
                raise UserError(f"optimizer {body.optimizer_config.type!r} is not served; use adamw")
            cfg = body.lora_config
            engine.create_model(
                model_id, LoraSpec(cfg.rank, cfg.seed, cfg.train_mlp, cfg.train_attn, cfg.train_unembed)
            )
            return {"type": "create_model", "model_id": model_id}

        return {"request_id": service.submit(run), "model_id": model_id}

    @app.post(f"{API}/get_info")
    async def get_info(request: Request):
        body = await parse(request, types.GetInfoRequest)
        trained = engine.trained.get(body.model_id)
        if trained is None:
            raise UserError(f"unknown model_id {body.model_id!r}")
        return {
            "type": "get_info",
            "model_id": body.model_id,
            "is_lora": True,
            "lora_rank": trained.spec.rank,
            "model_name": engine.name,
            "model_data": {
                "arch": engine.model.config.model_type,
                "model_name": engine.name,
                "tokenizer_id": engine.source,
            },
        }

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request):
        body = await request.body()
        if request.headers.get("content-encoding", "") == "zstd":
            import zstandard

            body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        if "protobuf" not in request.headers.get("content-type", ""):
            raise UserError("forward_backward takes a protobuf body (tinker SDK 0.25 or newer)")
        model_id, loss_fn, config, forward_only, data = wire.forward_backward_request(body)

        def run():
            logps, metrics = engine.forward_backward(model_id, data, loss_fn, config, backward=not forward_only)
            return wire.forward_backward_output(logps, metrics), wire.forward_backward_json(logps, metrics)

        return {"request_id": service.submit(run, proto=True), "model_id": model_id}

    @app.post(f"{API}/optim_step")
    async def optim_step(request: Request):
        body = await parse(request, types.OptimStepRequest)
        params = body.optim_params
        if not isinstance(params, types.AdamParams):
            raise UserError(
                f"optimizer params of type {getattr(params, 'type', '?')!r} are not served; use AdamParams"
            )

        def run():
            metrics = engine.optim_step(
                body.model_id,
                params.learning_rate,
                (params.beta1, params.beta2),
                params.eps,
                params.weight_decay,
                params.grad_clip_norm,
            )
            return {"type": "optim_step", "metrics": metrics}

        return {"request_id": service.submit(run), "model_id": body.model_id}

    @app.post(f"{API}/save_weights")
    async def save_weights(request: Request):
        body = await parse(request, types.SaveWeightsRequest)
        name = body.path or f"step-{uuid.uuid4().hex[:8]}"

        def run():
            path = engine.save(body.model_id, name, kind="weights", overwrite=body.overwrite)
            return {"type": "save_weights", "path": path}

        return {"request_id": service.submit(run), "model_id": body.model_id}

    @app.post(f"{API}/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request):
        body = await parse(request, types.SaveWeightsForSamplerRequest)

        def run():
            if body.path is not None:
                return {
                    "type": "save_weights_for_sampler",
                    "path": engine.save(body.model_id, body.path, kind="sampler_weights"),
                }
            path = engine.snapshot(body.model_id)
            session_id = body.model_id.split(":train:")[0]
            sampler_id = f"{session_id}:sample:{body.sampling_session_seq_id}"
            service.samplers[sampler_id] = path
            return {"type": "save_weights_for_sampler", "sampling_session_id": sampler_id}

        return {"request_id": service.submit(run), "model_id": body.model_id}

    @app.post(f"{API}/load_weights")
    async def load_weights(request: Request):
        body = await parse(request, types.LoadWeightsRequest)
        create = body.model_id is None
        model_id = body.model_id or f"{body.session_id}:train:{body.model_seq_id}"

        def run():
            if create:
                service.model_name_check(body.base_model)
            if body.optimizer_config is not None and body.optimizer_config.type != "adamw":
                raise UserError(f"optimizer {body.optimizer_config.type!r} is not served; use adamw")
            engine.load(model_id, body.path, with_optimizer=body.optimizer, create=create)
            return {"type": "load_weights", "path": body.path, "model_id": model_id}

        return {"request_id": service.submit(run), "model_id": model_id}

    # -- sampling -----------------------------------------------------------------------------------------------------

    @app.post(f"{API}/create_sampling_session")
    async def create_sampling_session(request: Request):
        body = await parse(request, types.CreateSamplingSessionRequest)
        if body.model_path is not None:
            engine.sampler_spec(body.model_path)  # a UserError (400) at once if nothing is saved there
        else:
            service.model_name_check(body.base_model)
        sampler_id = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
        service.samplers[sampler_id] = body.model_path
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.post(f"{API}/join_sampling_session")
    async def join_sampling_session(request: Request):
        body = await parse(request, types.JoinSamplingSessionRequest)
        if body.sampling_session_id not in service.samplers:
            raise UserError(f"unknown sampling session {body.sampling_session_id!r}")
        counter = service.sampler_clients.setdefault(body.sampling_session_id, itertools.count(1))
        return {"type": "join_sampling_session", "client_counter": next(counter)}

    @app.get(API + "/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        if sampler_id not in service.samplers:
            raise UserError(f"unknown sampling session {sampler_id!r}")
        return {"sampler_id": sampler_id, "base_model": engine.source, "model_path": service.samplers[sampler_id]}

    @app.post(f"{API}/asample")
    async def asample(request: Request):
        body = await parse(request, types.SampleRequest)
        if body.sampling_session_id is not None:
            if body.sampling_session_id not in service.samplers:
                raise UserError(f"unknown sampling session {body.sampling_session_id!r}")
            path = service.samplers[body.sampling_session_id]
        else:
            path = body.model_path
            if path is None:
                service.model_name_check(body.base_model)
        unserved = [
            name
            for name, on in (
                ("target_prompt_logprobs", body.target_prompt_logprobs is not None),
                ("prompt_alt_tokens_k", body.prompt_alt_tokens_k > 0),
                ("record_stability_info", bool(body.record_stability_info)),
            )
            if on
        ]
        params = body.sampling_params
        prompt = body.prompt.to_ints() if all(c.type == "encoded_text" for c in body.prompt.chunks) else None

        def run():
            if unserved:
                raise UserError(f"{', '.join(unserved)} is not served by grpokit's Tinker server")
            if prompt is None:
                raise UserError("the prompt has a non-text chunk; this server takes text only")
            result = engine.sample(
                path,
                prompt,
                body.num_samples,
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                stop=params.stop,
                seed=params.seed,
                prompt_logprobs=bool(body.prompt_logprobs),
                topk_prompt=body.topk_prompt_logprobs,
                topk_sample=body.topk_sample_logprobs,
                prompt_last_n=body.prompt_logprobs_last_n,
            )
            return wire.sample_response(result), wire.sample_json(result)

        request_id = service.submit(run, proto=True)
        return {
            "request_id": request_id,
            "sample_sequence_ids": [f"{request_id}:{i}" for i in range(body.num_samples)],
        }

    # -- futures ------------------------------------------------------------------------------------------------------

    @app.post(f"{API}/retrieve_future")
    async def retrieve_future(request: Request):
        body = await parse(request, types.FutureRetrieveRequest)
        future = service.futures.get(body.request_id)
        if future is None:
            return JSONResponse(
                {
                    "error": f"unknown request_id {body.request_id!r} (expired, or from another server run)",
                    "category": "user",
                }
            )
        try:
            await asyncio.wait_for(asyncio.shield(future.task), LONG_POLL_S)
        except asyncio.TimeoutError:
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        except Exception as error:  # noqa: BLE001 - the operation's own failure, answered as the SDK expects
            return JSONResponse(_failure(error))
        result = future.task.result()
        if future.proto:
            proto, as_json = result
            if wire.PROTO in request.headers.get("accept", ""):
                return Response(proto, media_type=wire.PROTO)
            return as_json
        return result

    @app.api_route(API + "/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def not_served(rest: str):
        return JSONResponse({"detail": f"/api/v1/{rest} is not served by grpokit's Tinker server"}, status_code=404)

    return app
