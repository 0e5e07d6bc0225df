"""Vision-language prompts, in TRL 1.16's format: a conversational `prompt` plus an `image` (one) or `images` (a list)
column; the images go into the first user turn as `{"type": "image"}` content blocks (or fill the placeholders the
prompt already has), and the processor (`AutoProcessor`) renders and encodes each prompt with its images.

What the processor returns besides the token ids (pixel values, image grid sizes, token-type ids, ...) is kept per
row (`VisionRows`): each row holds its own tensors, so rows travel through shuffling, micro-batching and chunked
scoring by plain indexing, with no slicing by cumulative image or patch counts; `VisionRows.model_inputs` collates
any subset of rows back into the batch layout the model's forward expects:

- per-token fields (`token_type_ids`, `mm_token_type_ids`): left-padded to the batch's prompt width with 0 and
  extended with 0 over the completion;
- fields indexed by prompt (`pixel_attention_mask`, and `pixel_values` of processors that batch images per prompt,
  5-D: Idefics3/SmolVLM): padded with zero images to the rows' largest image count and stacked (such models skip
  all-zero images);
- everything else (`pixel_values` of one entry per image or patch, `image_grid_thw`, `image_sizes`, ...): indexed
  by image or patch, concatenated in row order (LLaVA-NeXT's patches per image zero-padded to the most).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
from torch import Tensor

IMAGE_COLUMNS = ("images", "image")
PER_TOKEN = "token"
PER_PROMPT = "prompt"
PER_IMAGE = "image"
_PER_TOKEN_KEYS = ("token_type_ids", "mm_token_type_ids")


class VisionError(ValueError):
    """A row's images or vision prompt cannot be used: one line naming the row."""


# ------------------------------------------------------------------------------------------------ processing class


def is_processor(processing_class) -> bool:
    """Whether `processing_class` is a multimodal processor (text and images) rather than a tokenizer."""
    from transformers import ProcessorMixin

    return isinstance(processing_class, ProcessorMixin)


def tokenizer_of(processing_class):
    """The tokenizer of a processor, or the tokenizer itself."""
    return processing_class.tokenizer if is_processor(processing_class) else processing_class


def is_vision_model(model) -> bool:
    """Whether a model (or its config) has a vision tower: its config declares a `vision_config`."""
    config = getattr(model, "config", model)
    return getattr(config, "vision_config", None) is not None


def image_token_ids(processing_class, model=None) -> list[int]:
    """The ids a model must never sample: the image placeholder tokens the processor expands (e.g. `<image>`,
    `<|image_pad|>`, `<image_soft_token>`) and the model config's `image_token_id`."""
    tokenizer = tokenizer_of(processing_class)
    ids = set()
    for name in ("image_token_id", "image_token_index"):
        for source in (processing_class, getattr(model, "config", None)):
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
    token = getattr(processing_class, "image_token", None)
    if isinstance(token, str):
        value = tokenizer.convert_tokens_to_ids(token)
        if isinstance(value, int) and value != tokenizer.unk_token_id:
            ids.add(value)
    return sorted(ids)


# ------------------------------------------------------------------------------------------------ rows and prompts


def has_image_column(row: dict) -> bool:
    return any(row.get(column) is not None for column in IMAGE_COLUMNS)


def row_images(row: dict, index: int, split: str = "train", *, decode: bool = True) -> list | None:
    """The images of one dataset row as PIL images (`images`: a list, `image`: one), or None when it has none. A file
    path is opened; anything that is not an image is a `VisionError` naming the row. With `decode=False` the values
    are only checked (files exist, bytes present), not decoded."""
    column = next((c for c in IMAGE_COLUMNS if c in row), None)
    if column is None or row[column] is None:
        return None
    values = row[column] if column == "images" else [row[column]]
    if not isinstance(values, (list, tuple)):
        raise VisionError(
            f"{split} row {index}: column 'images' holds {type(values).__name__}; expected a list of images"
        )
    where = f"{split} row {index}: column {column!r}"
    return [as_image(value, where, decode=decode) for value in values] or None


def as_image(value, where: str, *, decode: bool = True):
    """A PIL image from a PIL image, a file path, or a `datasets` Image value (`{"bytes", "path"}`); with
    `decode=False` the value itself once checked (a file that exists, bytes that are there)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        if value.get("bytes"):
            if not decode:
                return value
            import io

            return _open(lambda: Image.open(io.BytesIO(value["bytes"])), where, "its bytes", UnidentifiedImageError)
        value = value.get("path")
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if not os.path.isfile(path):
            raise VisionError(f"{where}: image file {path!r} not found")
        if not decode:
            return value
        return _open(lambda: Image.open(path), where, repr(path), UnidentifiedImageError)
    raise VisionError(
        f"{where} holds {type(value).__name__}, not an image; give a PIL image, a file path or a datasets Image"
    )


def _open(opener, where: str, what: str, unreadable: type[Exception]):
    try:
        image = opener()
        image.load()
        return image
    except (unreadable, OSError) as exc:
        raise VisionError(f"{where}: {what} is not a readable image ({exc})") from None


def attach_images(prompt, images: list | None, index: int, split: str = "train"):
    """The conversational `prompt` with `images` in it, as TRL places them: string contents become text blocks, the
    first user turn written as a string gets one `{"type": "image"}` block per image before its text, and image
    blocks without a payload are filled in order. More or fewer images than places for them is a `VisionError`."""
    if not images:
        return prompt
    if not isinstance(prompt, list):
        raise VisionError(
            f"{split} row {index}: has images but its prompt is text; multimodal training requires conversational "
            "prompts ([{'role': 'user', 'content': ...}]), rendered by the processor's chat template"
        )
    placeholders = sum(
        1
        for message in prompt
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "image" and block.get("image") is None
    )
    pending = list(images)
    messages, placed = [], placeholders > 0
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}]
            if message["role"] == "user" and not placed:
                blocks = [*({"type": "image"} for _ in images), *blocks]
                placed = True
            content = blocks
        messages.append({**message, "content": content})
    filled = []
    for message in messages:
        blocks = message["content"]
        if isinstance(blocks, list):
            new_blocks = []
            for block in blocks:
                if block.get("type") == "image" and block.get("image") is None:
                    if not pending:
                        raise VisionError(
                            f"{split} row {index}: its prompt has more image placeholders than the row's "
                            f"{len(images)} image(s)"
                        )
                    block = {**block, "image": pending.pop(0)}
                new_blocks.append(block)
            message = {**message, "content": new_blocks}
        filled.append(message)
    if pending:
        raise VisionError(
            f"{split} row {index}: {len(images)} image(s) but {len(images) - len(pending)} image placeholder(s) in "
            "its prompt; give one {'type': 'image'} block per image (or none: they go before the first user text)"
        )
    return filled


def prompt_images(prompt) -> list:
    """The images inside a conversational prompt's content blocks, in order."""
    if not isinstance(prompt, list):
        return []
    return [
        block["image"]
        for message in prompt
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "image" and block.get("image") is not None
    ]


def without_images(prompt):
    """The prompt with each image's payload dropped (`{"type": "image"}` kept): what logs and records show."""
    if not isinstance(prompt, list):
        return prompt
    return [
        {
            **message,
            "content": [
                {k: v for k, v in block.items() if k != "image"} if block.get("type") == "image" else block
                for block in message["content"]
            ],
        }
        if isinstance(message.get("content"), list)
        else message
        for message in prompt
    ]


def check_image_rows(dataset, split: str = "train") -> None:
    """Before any model loads: every row's images are images (a file that exists, a datasets Image, a PIL image),
    and a row with images has a conversational prompt with no more image placeholders than images (`VisionError`
    naming the first bad row). Images are not decoded here (a datasets Image column is read undecoded): a file
    that exists but does not decode is named when its row is first used. Streaming datasets are checked as their
    rows arrive."""
    names = getattr(dataset, "column_names", None) or []
    column = next((c for c in IMAGE_COLUMNS if c in names), None)
    if column is None or not hasattr(dataset, "__len__"):
        return
    for index, row in enumerate(_undecoded_rows(dataset, column)):
        images = row_images(row, index, split, decode=False)
        if images:
            attach_images(row["prompt"], images, index, split)


def _undecoded_rows(dataset, column: str):
    """The rows' `prompt` and image column, a datasets Image read as `{"bytes", "path"}` (not decoded): through
    Arrow batches for a `datasets.Dataset` (its row order, indices included), row by row otherwise."""
    if not hasattr(dataset, "with_format"):
        yield from ({"prompt": row.get("prompt"), column: row.get(column)} for row in dataset)
        return
    table = dataset.select_columns([c for c in ("prompt", column) if c in dataset.column_names])
    for batch in table.with_format("arrow").iter(batch_size=1024):
        prompts = batch.column("prompt").to_pylist() if "prompt" in batch.column_names else [None] * batch.num_rows
        for prompt, images in zip(prompts, batch.column(column).to_pylist(), strict=True):
            yield {"prompt": prompt, column: images}


def refuse_images_without_processor(dataset, processing_class, split: str = "train") -> None:
    """An image column with a text-only tokenizer would train on prompts the model never sees the images of: a map-style
    dataset is checked whole here (its image column read through Arrow, not decoded); a stream's rows are checked as
    they arrive (`refuse_image_row`)."""
    names = getattr(dataset, "column_names", None) or []
    column = next((c for c in IMAGE_COLUMNS if c in names), None)
    if column is None or is_processor(processing_class) or not hasattr(dataset, "__len__"):
        return
    if hasattr(dataset, "with_format"):  # a datasets.Dataset: only the image column's nulls are looked at
        start = 0
        for batch in dataset.select_columns([column]).with_format("arrow").iter(batch_size=4096):
            values = batch.column(column)
            if values.null_count < len(values):
                index = start + next(i for i, v in enumerate(values.is_null().to_pylist()) if not v)
                prompt = dataset.select_columns(["prompt"])[index]["prompt"] if "prompt" in names else None
                refuse_image_row({column: True, "prompt": prompt}, index, processing_class, split)
            start += len(values)
        return
    for index, row in enumerate(dataset):
        refuse_image_row(row, index, processing_class, split)


def refuse_image_row(row: dict, index: int | str, processing_class, split: str = "train") -> None:
    """A `VisionError` naming the row when it has an image and the model is text-only. `index`: the row's number, or
    a phrase placing it (a stream's "stream row 80")."""
    if is_processor(processing_class):
        return
    column = next((c for c in IMAGE_COLUMNS if row.get(c) is not None), None)
    if column is not None:
        prompt = " ".join(str(row.get("prompt"))[:60].split())
        place = f"row {index}" if isinstance(index, int) else index
        raise VisionError(
            f"{split} {place}: has an image (column {column!r}) but the model is text-only (its processing class "
            f"is a tokenizer, {type(processing_class).__name__}); train a vision-language model with its "
            f"AutoProcessor, or drop the column (the row's prompt: {prompt!r})"
        )


# ------------------------------------------------------------------------------------------------ encoding


@dataclass
class Encoded:
    """One prompt encoded by the processor: its token ids and its other model inputs, each with its kind; and what a
    generation engine that runs the processor itself (vLLM) takes instead: the rendered prompt's tokens with each
    image still one placeholder, and the images."""

    ids: list[int]
    inputs: dict[str, tuple[str, Tensor]]
    engine_prompt: EnginePrompt | None = None


@dataclass
class EnginePrompt:
    """A prompt for an engine that expands image placeholders itself: the chat-rendered text's token ids (images
    not expanded) and its images. The engine must arrive at the processor's `ids` (it is checked)."""

    token_ids: list[int]
    images: list


def encode_vision_prompts(
    processor,
    prompts: list,
    *,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict | None = None,
    tools: list | None = None,
) -> tuple[list[list[int]], VisionRows]:
    """Render each conversational prompt with the processor's chat template and encode it with its images:
    `(prompt_ids, VisionRows)`. Identical consecutive prompts (a group's repeats) are encoded once. A prompt longer
    than `max_prompt_length` is cut on the left only where the cut keeps every image token; otherwise a
    `VisionError`."""
    cache: dict[tuple, Encoded] = {}
    never_cut = set(image_token_ids(processor)) | _image_marker_ids(processor)
    ids, rows, engine = [], [], []
    for index, prompt in enumerate(prompts):
        images = prompt_images(prompt)
        text = processor.apply_chat_template(
            prompt, tokenize=False, add_generation_prompt=True, tools=tools or None, **(chat_template_kwargs or {})
        )
        key = (text, tuple(_image_digest(image) for image in images))
        if key not in cache:
            cache.clear()  # repeats are consecutive: keep one prompt's encoding
            cache[key] = _encode_one(processor, text, images)
        encoded = _cut(cache[key], max_prompt_length, never_cut, index)
        ids.append(encoded.ids)
        rows.append(encoded.inputs)
        engine.append(encoded.engine_prompt)
    return ids, VisionRows(rows, engine)


def _encode_one(processor, text: str, images: list) -> Encoded:
    kwargs = {"images": [images]} if images else {}
    output = processor(text=[text], return_tensors="pt", add_special_tokens=False, **kwargs)
    inputs = {}
    for key, value in output.items():
        if key in ("input_ids", "attention_mask") or not isinstance(value, Tensor):
            continue
        kind = field_kind(key, value, output)
        inputs[key] = (kind, value[0] if kind in (PER_TOKEN, PER_PROMPT) else value)
    unexpanded = tokenizer_of(processor)(text, add_special_tokens=False)["input_ids"]
    return Encoded(output["input_ids"][0].tolist(), inputs, EnginePrompt(unexpanded, images))


def field_kind(key: str, value: Tensor, output) -> str:
    """How a processor output of one prompt (`output`, all its fields) is batched: per token, per prompt, or per
    image / patch. Pixel values are per prompt (images padded per prompt) only beside a pixel attention mask
    (Idefics3/SmolVLM); LLaVA-NeXT's 5-D pixel values are per image (its patches)."""
    if key in _PER_TOKEN_KEYS:
        return PER_TOKEN
    if key == "pixel_attention_mask" or (
        key == "pixel_values" and value.dim() == 5 and "pixel_attention_mask" in output
    ):
        return PER_PROMPT
    return PER_IMAGE


def _cut(encoded: Encoded, max_prompt_length: int | None, never_cut: set[int], index: int) -> Encoded:
    if max_prompt_length is None or len(encoded.ids) <= max_prompt_length:
        return encoded
    cut = len(encoded.ids) - max_prompt_length
    if any(token in never_cut for token in encoded.ids[:cut]):
        raise VisionError(
            f"prompt {index}: {len(encoded.ids)} tokens with its images, over max_prompt_length={max_prompt_length}, "
            "and cutting it on the left would cut through an image; raise max_prompt_length (or set it to null)"
        )
    inputs = {k: (kind, v[cut:] if kind == PER_TOKEN else v) for k, (kind, v) in encoded.inputs.items()}
    # The cut tokens precede every image, so the engine's unexpanded prompt loses the same tokens.
    engine = encoded.engine_prompt
    if engine is not None:
        engine = EnginePrompt(engine.token_ids[cut:], engine.images)
    return Encoded(encoded.ids[cut:], inputs, engine)


def _image_marker_ids(processor) -> set[int]:
    """Ids of the processor's image marker tokens (begin/end of image, image placeholders), which a cut must keep."""
    tokenizer = tokenizer_of(processor)
    ids = set()
    for name, value in vars(processor).items():
        if isinstance(value, str) and name.endswith("token") and ("image" in name or name.startswith(("boi", "eoi"))):
            token_id = tokenizer.convert_tokens_to_ids(value)
            if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                ids.add(token_id)
    return ids


def _image_digest(image) -> str:
    return hashlib.blake2b(image.tobytes(), digest_size=16).hexdigest() + f"{image.size}{image.mode}"


# ------------------------------------------------------------------------------------------------ rows


class VisionRows:
    """The vision inputs of a batch's rows, one dict per row (`{key: (kind, tensor)}`, empty for a text-only row),
    and each row's `EnginePrompt` for engines that encode images themselves (None where not known)."""

    def __init__(self, rows: list[dict[str, tuple[str, Tensor]]], engine_prompts: list | None = None):
        self.rows = rows
        self.engine_prompts = engine_prompts if engine_prompts is not None else [None] * len(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, index) -> VisionRows:
        """The rows at `index` (a slice, a list or a 1-D tensor of row numbers), in that order."""
        if isinstance(index, slice):
            return VisionRows(self.rows[index], self.engine_prompts[index])
        if isinstance(index, Tensor):
            index = index.tolist()
        return VisionRows([self.rows[i] for i in index], [self.engine_prompts[i] for i in index])

    def to(self, device) -> VisionRows:
        rows = [{k: (kind, v.to(device)) for k, (kind, v) in row.items()} for row in self.rows]
        return VisionRows(rows, self.engine_prompts)

    def model_inputs(
        self, prompt_width: int, completion_length: int = 0, rows: slice | None = None, device=None
    ) -> dict[str, Tensor]:
        """The model's extra inputs for `rows` (default all) of a batch whose prompts are left-padded to
        `prompt_width`, followed by `completion_length` completion positions."""
        selected = self.rows if rows is None else self.rows[rows]
        keys = {k: kind for row in selected for k, (kind, _) in row.items()}
        inputs = {}
        for key, kind in keys.items():
            values = [row[key][1] if key in row else None for row in selected]
            if kind == PER_TOKEN:
                inputs[key] = torch.stack([_per_token(v, prompt_width, completion_length, values) for v in values])
            elif kind == PER_PROMPT:
                inputs[key] = _stack_padded(values)
            else:
                inputs[key] = _cat_padded([v for v in values if v is not None])
        if device is not None:
            inputs = {k: v.to(device) for k, v in inputs.items()}
        return inputs


def _per_token(value: Tensor | None, prompt_width: int, completion_length: int, values: list) -> Tensor:
    like = next(v for v in values if v is not None)
    if value is None:
        return like.new_zeros(prompt_width + completion_length)
    left = prompt_width - value.size(0)
    return torch.cat([value.new_zeros(left), value, value.new_zeros(completion_length)])


def _cat_padded(values: list[Tensor]) -> Tensor:
    """Concatenate per-image tensors along dim 0, zero-padding their other dims to the largest (LLaVA-NeXT's
    patches per image differ between prompts encoded apart; the model reads each image's own count from
    `image_sizes` and skips the padding)."""
    shape = [max(v.size(d) for v in values) for d in range(1, values[0].dim())]
    padded = []
    for value in values:
        if list(value.shape[1:]) != shape:
            out = value.new_zeros((value.size(0), *shape))
            out[(slice(None), *(slice(0, n) for n in value.shape[1:]))] = value
            value = out
        padded.append(value)
    return torch.cat(padded)


def _stack_padded(values: list[Tensor | None]) -> Tensor:
    """Stack per-prompt tensors whose first dim (images) differs, padding with zeros (a zero image is padding)."""
    like = next(v for v in values if v is not None)
    most = max(v.size(0) for v in values if v is not None)
    out = like.new_zeros((len(values), most, *like.shape[1:]))
    for i, value in enumerate(values):
        if value is not None:
            out[i, : value.size(0)] = value
    return out
