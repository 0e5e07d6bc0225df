"""The Tinker wire format, through the SDK's own message definitions (`tinker.proto.tinker_public_pb2`): a
`forward_backward` request's protobuf body in, `ForwardBackwardOutput` and `SampleResponse` out as protobuf (the SDK
asks for them so), or as JSON for a client that does not accept protobuf."""

from __future__ import annotations

import numpy as np
import torch

from .engine import Datum, SampleResult, UserError

PROTO = "application/x-protobuf"


def _pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def _tensor(msg, name: str, datum: int) -> torch.Tensor:
    pb = _pb()
    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if msg.dtype not in dtypes:
        raise UserError(f"datum {datum}: loss_fn_inputs[{name!r}] has an unsupported dtype ({msg.dtype})")
    if msg.HasField("sparse_csr"):
        raise UserError(f"datum {datum}: loss_fn_inputs[{name!r}] is sparse; send it dense")
    values = np.frombuffer(msg.dense, dtype=dtypes[msg.dtype])
    shape = list(msg.shape)
    if shape and int(np.prod(shape)) != values.size:
        raise UserError(f"datum {datum}: loss_fn_inputs[{name!r}] has {values.size} values for shape {shape}")
    if len(shape) > 1:
        raise UserError(f"datum {datum}: loss_fn_inputs[{name!r}] has shape {shape}; this server takes 1-D inputs")
    array = values.astype(np.int64 if name == "target_tokens" else np.float32)
    return torch.from_numpy(array.copy())


def forward_backward_request(body: bytes) -> tuple[str, str, dict, bool, list[Datum]]:
    """(model_id, loss_fn, loss_fn_config, forward_only, data) of a protobuf `ForwardBackwardRequest`."""
    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # noqa: BLE001 - protobuf raises its own DecodeError
        raise UserError(f"the forward_backward body is not a ForwardBackwardRequest protobuf ({e})") from None
    config: dict = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for i, datum in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in datum.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise UserError(f"datum {i}: model_input has a {kind} chunk; this server takes text only")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        inputs = {name: _tensor(t, name, i) for name, t in datum.loss_fn_inputs.items()}
        data.append(Datum(tokens, inputs))
    if not data:
        raise UserError("forward_backward got no data")
    return msg.model_id, msg.loss_fn, config, msg.forward_only, data


def forward_backward_output(logps: list[torch.Tensor], metrics: dict[str, float]) -> bytes:
    """A protobuf `ForwardBackwardOutput`: one ArrayRecord holding each datum's `logprobs`."""
    pb = _pb()
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    record = out.loss_fn_outputs.add(num_datums=len(logps))
    arrays = [lp.numpy().astype(np.float32) for lp in logps]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
    field = record.fields["logprobs"]
    field.dtype = pb.DTYPE_FLOAT32
    field.data = b"".join(a.tobytes() for a in arrays)
    field.offsets = offsets.tobytes()
    return out.SerializeToString()


def forward_backward_json(logps: list[torch.Tensor], metrics: dict[str, float]) -> dict:
    outputs = [{"logprobs": {"data": lp.tolist(), "dtype": "float32", "shape": [lp.numel()]}} for lp in logps]
    return {"loss_fn_output_type": "ArrayRecord", "loss_fn_outputs": outputs, "metrics": metrics}


def _topk(msg, pair) -> None:
    ids, values = pair
    msg.length, msg.k = ids.shape
    msg.token_ids = ids.numpy().astype(np.int32).tobytes()
    msg.logprobs = values.numpy().astype(np.float32).tobytes()


def sample_response(result: SampleResult) -> bytes:
    pb = _pb()
    out = pb.SampleResponse()
    for seq in result.sequences:
        msg = out.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes(),
        )
        if seq.topk is not None:
            _topk(msg.topk_sampled_logprobs, seq.topk)
    if result.prompt_logprobs is not None:
        out.prompt_logprobs = result.prompt_logprobs.numpy().astype(np.float32).tobytes()
    if result.topk_prompt is not None:
        _topk(out.topk_prompt_logprobs, result.topk_prompt)
    return out.SerializeToString()


def sample_json(result: SampleResult) -> dict:
    def nan_none(values):
        return [None if v != v else v for v in values]

    return {
        "type": "sample",
        "sequences": [
            {"stop_reason": s.stop_reason, "tokens": s.tokens, "logprobs": s.logprobs} for s in result.sequences
        ],
        "prompt_logprobs": None if result.prompt_logprobs is None else nan_none(result.prompt_logprobs.tolist()),
    }
