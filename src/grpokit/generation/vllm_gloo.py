"""A "gloo" weight-transfer backend for vLLM: a CPU trainer pushes its weights into a running `vllm serve`.

vLLM ships NCCL and CUDA-IPC weight-transfer engines, which need a GPU on both ends. This one moves the same
checkpoint-format weights over a gloo process group (TCP, CPU tensors), so it works with vLLM's CPU build and with
a CPU trainer. It plugs into vLLM's own machinery:

- `register()` (the `vllm.general_plugins` entry point `grpokit_gloo_weight_transfer`, loaded by vLLM in every
  process) adds the backend name `gloo` to `WeightTransferEngineFactory` (worker side) and
  `WeightTransferTrainerFactory` (trainer side). `WeightTransferConfig.backend` is typed `Literal[...] | str` and
  checked against the factory's registry only when a worker creates its engine, so
  `vllm serve --weight-transfer-config '{"backend": "gloo"}'` works once grpokit is installed in vLLM's environment.
- Worker side, `GlooWeightTransferEngine` is driven through the server's weight-sync routes (present with
  `VLLM_SERVER_DEV_MODE=1`): `POST /init_weight_transfer_engine {"init_info": {master_address, master_port,
  rank_offset, world_size, ...}}` joins the group; then each push is `POST /start_weight_update`,
  `POST /update_weights {"update_info": {names, dtype_names, shapes}}` (which returns once every tensor has been
  received and loaded) and `POST /finish_weight_update`.
- Trainer side, `GlooTrainerWeightTransferEngine` (`WeightTransferTrainerFactory.trainer_init(GlooTrainerInitInfo(
  ...), client=..., source=...)`, then `send_weights()`) drives those calls through any `VLLMWeightSyncClient` and
  broadcasts the tensors as rank 0.

The group is built straight from a `TCPStore` and a `ProcessGroupGloo`, never through
`torch.distributed.init_process_group`: the trainer may already have a default group (accelerate) and so has the
vLLM worker. The store is hosted by the first vLLM worker at `master_address:master_port` (the server's host), so
the trainer only needs to reach the server. Tensors travel as raw bytes, packed into buckets of `bucket_bytes`, so
every dtype works and a small model costs a handful of broadcasts.

This module imports vLLM; nothing imports it at `import grpokit` time.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as tdist
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from .vllm_common import hosted_store, local_address_towards, reprocess_tied_embeddings

logger = logging.getLogger(__name__)

BACKEND = "gloo"
DEFAULT_BUCKET_BYTES = 64 * 1024 * 1024
DEFAULT_TIMEOUT_S = 600.0
_ALIGN = 64  # byte alignment of each tensor inside a bucket, so `view(dtype)` of a slice is always legal


@dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """Worker-side init info: the store's address (the server's host), this worker group's first rank and the
    group's size (1 trainer + every vLLM worker across TP, PP and DP)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer-side init info; `rank` (keyword-only, from `TrainerInitInfo`) 0 is the sender."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One push: the checkpoint names, dtype names (`"float32"`, `"bfloat16"`, ...) and shapes, in send order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )
        for dtype_name in self.dtype_names:
            if not isinstance(getattr(torch, dtype_name, None), torch.dtype):
                raise ValueError(f"unknown dtype name {dtype_name!r}")


# ---------------------------------------------------------------------------------------------------------------
# The wire: a gloo group from a TCPStore, buckets of raw bytes.


def _nbytes(dtype: torch.dtype, shape) -> int:
    numel = 1
    for size in shape:
        numel *= int(size)
    return numel * dtype.itemsize


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def plan_buckets(dtypes: list[torch.dtype], shapes: list, bucket_bytes: int) -> list[list[int]]:
    """Indices of the tensors in each bucket, in order; a tensor larger than `bucket_bytes` travels alone. Both
    ends compute it from the same metadata, so the bucket boundaries agree."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, (dtype, shape) in enumerate(zip(dtypes, shapes, strict=True)):
        n = _aligned(_nbytes(dtype, shape))
        if current and size + n > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        buckets.append(current)
    return buckets


def _bucket_size(indices: list[int], dtypes, shapes) -> int:
    return sum(_aligned(_nbytes(dtypes[i], shapes[i])) for i in indices)


def _gloo_device(hostname: str):
    """The gloo device (the local address peers connect to); `GLOO_SOCKET_IFNAME` picks an interface instead."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        return tdist.ProcessGroupGloo.create_device(interface=interface.split(",")[0])
    return tdist.ProcessGroupGloo.create_device(hostname=hostname)


def _connect_store(host: str, port: int, timeout_s: float, gave_up=None):
    """A client of the `TCPStore` at `host:port`, waiting up to `timeout_s` for it to listen; `gave_up()` (called
    between tries) may raise to stop early, e.g. when the side that should host the store has already failed. The
    port is probed with a plain socket first: failed `TCPStore` connects log C++ stack traces."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                break
        except OSError:
            if gave_up is not None:
                gave_up()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listens at {host}:{port} after {timeout_s:g}s") from None
            time.sleep(0.2)
    remaining = max(1.0, deadline - time.monotonic())
    return tdist.TCPStore(host, port, None, False, datetime.timedelta(seconds=remaining), wait_for_workers=False)


class GlooGroup:
    """A gloo process group of `world_size` ranks over a `TCPStore` at `host:port`, independent of (and never
    touching) torch's default process group. `is_store_host` ranks host the store (exactly one)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        is_store_host: bool,
        device_hostname: str,
        timeout_s: float,
        gave_up=None,
    ):
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank = rank
        self.world_size = world_size
        if is_store_host:
            self.store = hosted_store(host, port, timeout)
        else:
            self.store = _connect_store(host, port, timeout_s, gave_up)
            self.store.set_timeout(timeout)
        options = tdist.ProcessGroupGloo._Options()
        options._devices = [_gloo_device(device_hostname)]
        options._timeout = timeout
        self.group = tdist.ProcessGroupGloo(tdist.PrefixStore("grpokit_gloo", self.store), rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        options = tdist.BroadcastOptions()
        options.rootRank = src
        options.rootTensor = 0
        self.group.broadcast([tensor], options).wait()

    def close(self) -> None:
        self.group = None
        self.store = None


def send_buckets(group: GlooGroup, pairs: Iterator[tuple[str, torch.Tensor]], metas: list[ParamMeta], bucket_bytes):
    """Broadcast the tensors of `pairs` (checked against `metas`) from rank 0, packed into byte buckets."""
    dtypes = [m.dtype for m in metas]
    shapes = [list(m.shape) for m in metas]
    it = iter(pairs)
    for indices in plan_buckets(dtypes, shapes, bucket_bytes):
        buffer = torch.empty(_bucket_size(indices, dtypes, shapes), dtype=torch.uint8)
        offset = 0
        for i in indices:
            name, tensor = next(it)
            meta = metas[i]
            if name != meta.name or tensor.dtype != meta.dtype or tuple(tensor.shape) != tuple(meta.shape):
                raise ValueError(
                    f"weight {i} is {name!r} {tensor.dtype} {tuple(tensor.shape)} but the receiver expects "
                    f"{meta.name!r} {meta.dtype} {tuple(meta.shape)}"
                )
            n = _nbytes(meta.dtype, meta.shape)
            if n:
                flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                buffer[offset : offset + n].copy_(flat)
            offset += _aligned(n)
        group.broadcast(buffer, src=0)
    if next(it, None) is not None:
        raise ValueError(f"the weight source yielded more than the {len(metas)} weights it declared")


def receive_buckets(group: GlooGroup, info: GlooWeightTransferUpdateInfo, bucket_bytes: int):
    """Receive what `send_buckets` sends; yields one list of `(name, tensor)` per bucket (views of the bucket)."""
    dtypes = [getattr(torch, d) for d in info.dtype_names]
    shapes = [list(s) for s in info.shapes]
    for indices in plan_buckets(dtypes, shapes, bucket_bytes):
        buffer = torch.empty(_bucket_size(indices, dtypes, shapes), dtype=torch.uint8)
        group.broadcast(buffer, src=0)
        weights, offset = [], 0
        for i in indices:
            n = _nbytes(dtypes[i], shapes[i])
            weights.append((info.names[i], buffer[offset : offset + n].view(dtypes[i]).view(shapes[i])))
            offset += _aligned(n)
        yield weights


# ---------------------------------------------------------------------------------------------------------------
# Worker side (inside the vLLM server's workers).


class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    """Receives checkpoint-format weights by gloo broadcast from the trainer (rank 0) and loads them with the
    model's `load_weights`, inside vLLM's layerwise reload lifecycle (as the NCCL engine does), so every layer's
    post-load processing (e.g. the CPU backend's pre-packed GEMM weights) runs again on the new values."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: GlooGroup | None = None
        self.bucket_bytes = DEFAULT_BUCKET_BYTES

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        self.shutdown()  # a trainer that reconnects replaces the old group (and frees the store's port)
        parallel = self.parallel_config
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.bucket_bytes = init_info.bucket_bytes
        self.group = GlooGroup(
            host=init_info.master_address,
            port=init_info.master_port,
            rank=init_info.rank_offset + worker_rank,
            world_size=init_info.world_size,
            is_store_host=worker_rank == 0,
            device_hostname=init_info.master_address,
            timeout_s=init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises on a CPU-only torch.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer is not initialised: call init_weight_transfer_engine first")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        with disable_mtp_completeness_check():
            for weights in receive_buckets(self.group, update_info, self.bucket_bytes):
                self.model.load_weights(weights)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        reprocess_tied_embeddings(self.model)

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


# ---------------------------------------------------------------------------------------------------------------
# Trainer side.


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer-side gloo engine: on the sender (rank 0) it joins the group and drives each push through the
    `VLLMWeightSyncClient` (start, update concurrently with the broadcast, finish). Other trainer ranks only iterate
    the source (a no-op for replicated weights), as vLLM's NCCL trainer engine does."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource, is_sender: bool = True, info=None):
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.info: GlooTrainerInitInfo | None = info
        self.group: GlooGroup | None = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError("the gloo trainer weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, info=init_info)
        if not engine.is_sender:
            return engine
        worker_info = GlooWeightTransferInitInfo(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank_offset=1,
            world_size=init_info.world_size,
            bucket_bytes=init_info.bucket_bytes,
            timeout_s=init_info.timeout_s,
        )
        # The workers block inside init_weight_transfer_engine until every rank has joined: call it on a side
        # thread while this process joins as rank 0.
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(client.init_weight_transfer_engine, asdict(worker_info))
            try:
                engine.group = GlooGroup(
                    host=init_info.master_address,
                    port=init_info.master_port,
                    rank=0,
                    world_size=init_info.world_size,
                    is_store_host=False,
                    device_hostname=local_address_towards(init_info.master_address, init_info.master_port),
                    timeout_s=init_info.timeout_s,
                    gave_up=lambda: future.result() if future.done() else None,
                )
            except Exception:
                if future.done():
                    future.result()  # the server's error explains the failed rendezvous better
                raise
            future.result()
        return engine

    def send_weights(self) -> None:
        source = self.source
        metas = source.metadata()
        if not self.is_sender:
            for _ in source:
                pass
            return
        assert self.group is not None and self.info is not None
        update_info = GlooWeightTransferUpdateInfo(
            names=[m.name for m in metas],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in metas],
            shapes=[list(m.shape) for m in metas],
        )
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            future = pool.submit(self.client.update_weights, asdict(update_info))
            send_buckets(self.group, iter(source), metas, self.info.bucket_bytes)
            future.result()
        finally:
            # Never join the RPC thread on an error: the worker may still wait in a broadcast that never comes.
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


# ---------------------------------------------------------------------------------------------------------------


def register() -> None:
    """Register the `gloo` backend with vLLM's worker and trainer weight-transfer factories (the
    `vllm.general_plugins` entry point). Idempotent: a name already registered is left as it is."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, engine_cls in (
        (WeightTransferEngineFactory, GlooWeightTransferEngine),
        (WeightTransferTrainerFactory, GlooTrainerWeightTransferEngine),
    ):
        if BACKEND in getattr(factory, "_registry", {}):
            continue
        try:
            factory.register_engine(BACKEND, engine_cls)
        except ValueError:  # registered meanwhile
            pass
