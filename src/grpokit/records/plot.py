"""`reward_curve.png`: reward ± reward_std and loss over steps, drawn from a run's metrics.jsonl, with the eval reward
(`eval_reward` ± `eval_reward_std`) as markers when the run evaluated, held-out accuracy and tool calls when logged.
Drawn by the run when training ends (see `grpokit.records.recorder`), and again by `grpokit plot RUN_DIR`.

Drawn with Pillow, not matplotlib: importing matplotlib and laying out its figure cost every run 0.3-0.4 s of CPU in
`train()`, for a chart of two panels whose layout never changes. Shapes are drawn at twice the size and reduced by a
box filter (antialiased lines for a few milliseconds), text at the final size with Pillow's own TrueType font."""

from __future__ import annotations

import json
import math
import os

SIZE = (700, 600)  # pixels of the PNG
SCALE = 2  # shapes are drawn at SCALE x the size, then reduced: antialiasing
# Each panel's box (left, top, right, bottom) in pixels of the final image: the same for every run
REWARD_BOX = (91, 52, 679, 318)
LOSS_BOX = (91, 358, 679, 552)
# A third panel when the run logged the sampler/learner mismatch (sampler/ratio/*): the image grows to SAMPLER_HEIGHT
SAMPLER_BOX = (91, 598, 679, 752)
SAMPLER_HEIGHT = 800
MARGIN = 0.05  # of the data range, on each side of both axes (as matplotlib's default)
COLOURS = {  # matplotlib's tab10, so that plots read as before
    "blue": (31, 119, 180),
    "orange": (255, 127, 14),
    "green": (44, 160, 44),
    "red": (214, 39, 40),
    "purple": (148, 103, 189),
}
GRID = (176, 176, 176, 77)
BAND_ALPHA = 51  # of 255: the ± reward_std band
LINE_WIDTH = 2  # pixels of the final image
LOSS_NOTE = "loss: near 0 by design in GRPO (advantages average to 0 per group); the reward shows progress"
SAMPLER_NOTE = "learner / sampler probability of sampled tokens: median, 5-95 % band (1: agree); dotted: share dropped"


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"{path} does not exist: is {run_dir} a grpokit run directory?")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{number}: not a JSON object") from None
    return rows


def has_reward_rows(run_dir: str) -> bool:
    """Whether RUN_DIR/metrics.jsonl exists and has a training row with a reward (what the plot needs)."""
    try:
        return bool(curve_series(read_metrics(run_dir))["reward"]["step"])
    except ValueError:
        return False


def curve_series(rows: list[dict]) -> dict[str, dict[str, list]]:
    """The series the plot draws, from metrics.jsonl rows: {"reward": {step, mean, std}, "loss": {step, value},
    "eval_reward": {step, mean, std}, "tool_calls": {step, value}, "held_out": {step, value}, "sampler": {step, p05,
    p50, p95, dropped}}; a series with no rows has empty lists. Training rows are those with `reward`, evaluation rows those with `eval_reward` (TRL's names; an
    evaluation's row has no `reward`)."""
    train = [r for r in rows if "reward" in r and "step" in r]
    evaluation = [r for r in rows if "eval_reward" in r and "step" in r]
    losses = [r for r in train if "loss" in r]
    mismatch = [r for r in train if "sampler/ratio/p50" in r]
    return {
        "reward": {
            "step": [r["step"] for r in train],
            "mean": [r["reward"] for r in train],
            "std": [r.get("reward_std", 0.0) for r in train],
        },
        "loss": {"step": [r["step"] for r in losses], "value": [r["loss"] for r in losses]},
        "eval_reward": {
            "step": [r["step"] for r in evaluation],
            "mean": [r["eval_reward"] for r in evaluation],
            "std": [r.get("eval_reward_std", 0.0) for r in evaluation],
        },
        "tool_calls": {
            "step": [r["step"] for r in train if "tools/call_frequency" in r],
            "value": [r["tools/call_frequency"] for r in train if "tools/call_frequency" in r],
        },
        "held_out": {
            "step": [r["step"] for r in rows if "held_out/greedy_accuracy" in r],
            "value": [r["held_out/greedy_accuracy"] for r in rows if "held_out/greedy_accuracy" in r],
        },
        "sampler": {
            "step": [r["step"] for r in mismatch],
            "p05": [r.get("sampler/ratio/p05", r["sampler/ratio/p50"]) for r in mismatch],
            "p50": [r["sampler/ratio/p50"] for r in mismatch],
            "p95": [r.get("sampler/ratio/p95", r["sampler/ratio/p50"]) for r in mismatch],
            "dropped": [r.get("sampler/masked_fraction", r.get("sampler/clipped_fraction")) for r in mismatch],
        },
    }


# ---------------------------------------------------------------------------------------------------------- axes


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def data_range(values: list[float]) -> tuple[float, float]:
    """The axis limits for VALUES: their span widened by MARGIN on each side; a single value (or none) gets ±0.5 of
    itself or ±0.5 at 0, so that a flat line sits mid-panel."""
    finite = [v for v in values if _finite(v)]
    if not finite:
        return -0.5, 0.5
    low, high = min(finite), max(finite)
    if high == low:
        half = abs(low) * 0.5 or 0.5
        return low - half, high + half
    pad = (high - low) * MARGIN
    return low - pad, high + pad


def nice_step(span: float, count: int = 6, integer: bool = False) -> float:
    """The tick spacing for a range SPAN: the smallest of 1, 2, 2.5, 5 (times a power of ten) that puts at most COUNT
    intervals in it; at least 1 when INTEGER (optimizer steps)."""
    raw = span / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw * (1 - 1e-9))
    return max(step, 1.0) if integer else step


def ticks(low: float, high: float, count: int = 6, integer: bool = False) -> list[float]:
    """Tick values inside [LOW, HIGH], every `nice_step` apart, on multiples of it."""
    step = nice_step(high - low, count, integer)
    first = math.ceil(low / step - 1e-9)
    values = []
    k = first
    while k * step <= high + step * 1e-9:
        values.append(round(k * step, 12) + 0.0)  # + 0.0: no "-0"
        k += 1
    return values


def tick_label(value: float, step: float) -> str:
    """VALUE written with the decimals its axis' STEP needs (0.25 -> 2 decimals, 5 -> none); scientific when the
    step is below 1e-3 or the value reaches 1e6."""
    if step < 1e-3 or abs(value) >= 1e6:
        return "0" if value == 0 else f"{value:.1e}"
    decimals = 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-9:
        decimals += 1
    return f"{value:.{decimals}f}"


class Panel:
    """One panel: its box in final-image pixels and its data limits; `at` maps data to pixels of the drawn (SCALE x)
    image."""

    def __init__(self, box, x_limits, y_limits):
        self.box = box
        self.x_limits = x_limits
        self.y_limits = y_limits

    def x(self, value: float) -> float:
        left, _, right, _ = self.box
        low, high = self.x_limits
        return (left + (value - low) / (high - low) * (right - left)) * SCALE

    def y(self, value: float) -> float:
        _, top, _, bottom = self.box
        low, high = self.y_limits
        return (bottom - (value - low) / (high - low) * (bottom - top)) * SCALE

    def at(self, x: float, y: float) -> tuple[float, float]:
        return self.x(x), self.y(y)

    def pieces(self, xs, ys) -> list[list[tuple[float, float]]]:
        """The polyline through the points, broken where a value is not finite (NaN, inf), as matplotlib draws it."""
        runs, current = [], []
        for x, y in zip(xs, ys, strict=True):
            if _finite(x) and _finite(y):
                current.append(self.at(x, y))
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        return runs


# ------------------------------------------------------------------------------------------------------ drawing


def _dashes(points, pattern: list[float]) -> list[list[tuple[float, float]]]:
    """The polyline POINTS cut by PATTERN (lengths in pixels: drawn, skipped, drawn, skipped, ..., repeated); a dash
    may turn a corner."""
    dashes, current, index = [], [points[0]], 0
    left = pattern[0]
    for (x0, y0), (x1, y1) in zip(points[:-1], points[1:], strict=True):
        length = math.hypot(x1 - x0, y1 - y0)
        done = 0.0
        while length - done > left:
            done += left
            t = done / length
            point = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t)
            if index % 2 == 0:  # a dash ends here
                current.append(point)
                dashes.append(current)
            current = [point]
            index = (index + 1) % len(pattern)
            left = pattern[index]
        left -= length - done
        if index % 2 == 0:
            current.append((x1, y1))
    if index % 2 == 0 and len(current) > 1:
        dashes.append(current)
    return dashes


# matplotlib's dash patterns, in line widths
STYLES = {"solid": None, "dashed": [3.7, 1.6], "dotted": [1.0, 1.65], "dashdot": [6.4, 1.6, 1.0, 1.6]}


def _line(draw, points, colour, style: str = "solid") -> None:
    width = LINE_WIDTH * SCALE
    if len(points) == 1:
        x, y = points[0]
        draw.ellipse((x - width / 2, y - width / 2, x + width / 2, y + width / 2), fill=colour)
        return
    pattern = STYLES[style]
    pieces = [points] if pattern is None else _dashes(points, [length * width for length in pattern])
    for piece in pieces:
        draw.line(piece, fill=colour, width=width, joint="curve")


def _marker(draw, point, colour, shape: str) -> None:
    x, y = point
    r = 3 * SCALE
    if shape == "o":
        draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
    else:
        draw.rectangle((x - r, y - r, x + r, y + r), fill=colour)


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)  # Pillow's embedded TrueType font; its bitmap font without FreeType


def _text(draw, xy, text: str, font, align: str = "left", valign: str = "top", fill=(0, 0, 0)) -> None:
    """TEXT placed by its ink box: ALIGN left/center/right of x, VALIGN top/middle/bottom of y (final pixels)."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    x, y = xy
    x -= {"left": 0, "center": (right - left) / 2, "right": right - left}[align] + left
    y -= {"top": 0, "middle": (bottom - top) / 2, "bottom": bottom - top}[valign] + top
    draw.text((round(x), round(y)), text, font=font, fill=fill)


def _vertical_text(image, center, text: str, font) -> None:
    """TEXT turned a quarter left (read bottom to top), centred on CENTER."""
    from PIL import Image, ImageDraw

    left, top, right, bottom = ImageDraw.Draw(image).textbbox((0, 0), text, font=font)
    mask = Image.new("L", (right - left + 2, bottom - top + 2), 0)
    ImageDraw.Draw(mask).text((1 - left, 1 - top), text, font=font, fill=255)
    mask = mask.rotate(90, expand=True)
    x, y = center
    image.paste((0, 0, 0), (round(x - mask.width / 2), round(y - mask.height / 2)), mask)


def _frame(draw, panel: Panel, x_ticks, y_ticks) -> None:
    """The grid at the ticks, the box, and the tick marks (outside the box), in the drawn (SCALE x) image."""
    left, top, right, bottom = (v * SCALE for v in panel.box)
    for value in x_ticks:
        draw.line([(panel.x(value), top), (panel.x(value), bottom)], fill=GRID, width=SCALE)
    for value in y_ticks:
        draw.line([(left, panel.y(value)), (right, panel.y(value))], fill=GRID, width=SCALE)


def _box(draw, panel: Panel, x_ticks, y_ticks) -> None:
    left, top, right, bottom = (v * SCALE for v in panel.box)
    draw.rectangle((left, top, right, bottom), outline=(0, 0, 0), width=SCALE)
    tick = 4 * SCALE
    for value in x_ticks:
        draw.line([(panel.x(value), bottom), (panel.x(value), bottom + tick)], fill=(0, 0, 0), width=SCALE)
    for value in y_ticks:
        draw.line([(left - tick, panel.y(value)), (left, panel.y(value))], fill=(0, 0, 0), width=SCALE)


def _labels(draw, panel: Panel, x_ticks, y_ticks, font, x_labels: bool) -> None:
    left, _, _, bottom = panel.box
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    for value in y_ticks:
        _text(draw, (left - 7, panel.y(value) / SCALE), tick_label(value, y_step), font, "right", "middle")
    if x_labels:
        x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
        for value in x_ticks:
            _text(draw, (panel.x(value) / SCALE, bottom + 7), tick_label(value, x_step), font, "center", "top")


def plot_run(run_dir: str) -> str:
    """Draw RUN_DIR/reward_curve.png; return its path."""
    from PIL import Image, ImageDraw

    series = curve_series(read_metrics(run_dir))
    reward, loss, evaluation = series["reward"], series["loss"], series["eval_reward"]
    held_out, calls = series["held_out"], series["tool_calls"]
    if not reward["step"]:
        raise ValueError(f"{run_dir}/metrics.jsonl has no logged training step with a reward")
    steps = reward["step"] + loss["step"] + evaluation["step"] + held_out["step"] + calls["step"]
    x_limits = data_range(steps)
    upper = [m + s for m, s in zip(reward["mean"], reward["std"], strict=True)]
    lower = [m - s for m, s in zip(reward["mean"], reward["std"], strict=True)]
    eval_upper = [m + s for m, s in zip(evaluation["mean"], evaluation["std"], strict=True)]
    eval_lower = [m - s for m, s in zip(evaluation["mean"], evaluation["std"], strict=True)]
    top = Panel(
        REWARD_BOX, x_limits, data_range(upper + lower + eval_upper + eval_lower + held_out["value"] + calls["value"])
    )
    bottom = Panel(LOSS_BOX, x_limits, data_range(loss["value"]))
    x_ticks = ticks(*x_limits, integer=True)
    top_ticks, bottom_ticks = ticks(*top.y_limits, count=5), ticks(*bottom.y_limits, count=4)
    mismatch = series["sampler"]
    third = None
    if mismatch["step"]:
        dropped = [v for v in mismatch["dropped"] if v is not None]
        third = Panel(SAMPLER_BOX, x_limits, data_range(mismatch["p05"] + mismatch["p95"] + [1.0] + dropped))
        third_ticks = ticks(*third.y_limits, count=4)
    height = SAMPLER_HEIGHT if third else SIZE[1]

    image = Image.new("RGB", (SIZE[0] * SCALE, height * SCALE), (255, 255, 255))
    draw = ImageDraw.Draw(image, "RGBA")  # RGBA fills blend into the RGB image: the band, the grid
    _frame(draw, top, x_ticks, top_ticks)
    _frame(draw, bottom, x_ticks, bottom_ticks)
    if third:
        _frame(draw, third, x_ticks, third_ticks)
        _sampler_curves(draw, third, mismatch)
    band = [(s, u, lo) for s, u, lo in zip(reward["step"], upper, lower, strict=True) if _finite(u) and _finite(lo)]
    if len(band) > 1:
        outline = [top.at(s, u) for s, u, _ in band] + [top.at(s, lo) for s, _, lo in reversed(band)]
        draw.polygon(outline, fill=COLOURS["blue"] + (BAND_ALPHA,))
    legend = [("reward (mean)", "blue", "solid", None), ("± reward_std", "blue", "band", None)]
    for piece in top.pieces(reward["step"], reward["mean"]):
        _line(draw, piece, COLOURS["blue"])
    if evaluation["step"]:
        for step, mean, std in zip(evaluation["step"], evaluation["mean"], evaluation["std"], strict=True):
            if _finite(mean) and _finite(std) and std > 0:
                x, cap = top.x(step), 3 * SCALE
                y0, y1 = top.y(mean - std), top.y(mean + std)
                draw.line([(x, y0), (x, y1)], fill=COLOURS["orange"], width=LINE_WIDTH * SCALE // 2 + 1)
                for y in (y0, y1):
                    draw.line([(x - cap, y), (x + cap, y)], fill=COLOURS["orange"], width=LINE_WIDTH * SCALE // 2 + 1)
        for piece in top.pieces(evaluation["step"], evaluation["mean"]):
            _line(draw, piece, COLOURS["orange"], "dashed")
            for point in piece:
                _marker(draw, point, COLOURS["orange"], "o")
        legend.append(("eval reward ± std", "orange", "dashed", "o"))
    if held_out["step"]:  # the real demo: greedy accuracy on prompts never trained on, before and after
        for piece in top.pieces(held_out["step"], held_out["value"]):
            _line(draw, piece, COLOURS["purple"], "dashdot")
            for point in piece:
                _marker(draw, point, COLOURS["purple"], "s")
        legend.append(("held-out accuracy (greedy)", "purple", "dashdot", "s"))
    if calls["step"]:  # an agent run: tool calls per completion beside the reward
        for piece in top.pieces(calls["step"], calls["value"]):
            _line(draw, piece, COLOURS["green"], "dotted")
        legend.append(("tool calls per completion", "green", "dotted", None))
    for piece in bottom.pieces(loss["step"], loss["value"]):
        _line(draw, piece, COLOURS["red"])
    _box(draw, top, x_ticks, top_ticks)
    _box(draw, bottom, x_ticks, bottom_ticks)
    if third:
        _box(draw, third, x_ticks, third_ticks)

    small, normal, large = _font(11), _font(13), _font(16)
    entries = _legend_shapes(draw, legend, normal)
    image = image.reduce(SCALE)
    draw = ImageDraw.Draw(image)
    _labels(draw, top, x_ticks, top_ticks, normal, x_labels=False)
    _labels(draw, bottom, x_ticks, bottom_ticks, normal, x_labels=third is None)
    last = LOSS_BOX
    if third:
        _labels(draw, third, x_ticks, third_ticks, normal, x_labels=True)
        _text(
            draw, ((SAMPLER_BOX[0] + SAMPLER_BOX[2]) / 2, SAMPLER_BOX[1] - 6), SAMPLER_NOTE, small, "center", "bottom"
        )
        _vertical_text(image, (22, (SAMPLER_BOX[1] + SAMPLER_BOX[3]) / 2), "ratio", normal)
        last = SAMPLER_BOX
    for text, xy in entries:
        _text(draw, xy, text, normal, "left", "middle")
    _text(draw, (SIZE[0] / 2, 14), os.path.basename(os.path.abspath(run_dir)), large, "center", "top")
    _text(draw, ((LOSS_BOX[0] + LOSS_BOX[2]) / 2, LOSS_BOX[1] - 6), LOSS_NOTE, small, "center", "bottom")
    _text(draw, ((last[0] + last[2]) / 2, last[3] + 26), "optimizer step", normal, "center", "top")
    _vertical_text(image, (22, (REWARD_BOX[1] + REWARD_BOX[3]) / 2), "reward", normal)
    _vertical_text(image, (22, (LOSS_BOX[1] + LOSS_BOX[3]) / 2), "loss", normal)
    path = os.path.join(run_dir, "reward_curve.png")
    image.save(path, "PNG", compress_level=1)  # zlib's fastest level: the file stays small (a few tens of KB)
    return path


def _sampler_curves(draw, panel: Panel, mismatch: dict) -> None:
    """The mismatch panel's curves: a grey line at 1, the p05-p95 band and the median (teal), and the share a
    correction masked or clamped (dotted red), where logged."""
    left, _, right, _ = panel.box
    draw.line([(left * SCALE, panel.y(1.0)), (right * SCALE, panel.y(1.0))], fill=(120, 120, 120), width=SCALE)
    band = [(s, lo, hi) for s, lo, hi in zip(mismatch["step"], mismatch["p05"], mismatch["p95"], strict=True)]
    band = [(s, lo, hi) for s, lo, hi in band if _finite(lo) and _finite(hi)]
    teal = (23, 190, 207)
    if len(band) > 1:
        outline = [panel.at(s, hi) for s, _, hi in band] + [panel.at(s, lo) for s, lo, _ in reversed(band)]
        draw.polygon(outline, fill=teal + (BAND_ALPHA,))
    for piece in panel.pieces(mismatch["step"], mismatch["p50"]):
        _line(draw, piece, teal)
    dropped = [(s, v) for s, v in zip(mismatch["step"], mismatch["dropped"], strict=True) if v is not None]
    if dropped:
        for piece in panel.pieces([s for s, _ in dropped], [v for _, v in dropped]):
            _line(draw, piece, COLOURS["red"], "dotted")


def _legend_shapes(draw, entries, font) -> list[tuple[str, tuple[float, float]]]:
    """The legend's box, at the reward panel's lower right, and each entry's sample line, in the drawn (SCALE x)
    image; returns where each entry's text goes (final pixels), written once the image is reduced."""
    row, sample, pad = 20, 28, 8
    width = pad * 3 + sample + max(font.getlength(text) for text, *_ in entries)
    height = pad * 2 + row * len(entries) - 4
    right, bottom = REWARD_BOX[2] - 8, REWARD_BOX[3] - 8
    left, top = right - width, bottom - height
    draw.rounded_rectangle(
        [v * SCALE for v in (left, top, right, bottom)],
        radius=3 * SCALE,
        fill=(255, 255, 255, 204),
        outline=(204, 204, 204),
        width=SCALE,
    )
    texts = []
    for number, (text, colour, style, marker) in enumerate(entries):
        y = top + pad + row * number + (row - 4) / 2
        x0, x1 = left + pad, left + pad + sample
        if style == "band":
            draw.rectangle(
                [v * SCALE for v in (x0, y - 5, x1, y + 5)], fill=COLOURS[colour] + (BAND_ALPHA,), outline=None
            )
        else:
            _line(draw, [(x0 * SCALE, y * SCALE), (x1 * SCALE, y * SCALE)], COLOURS[colour], style)
        if marker:
            _marker(draw, ((x0 + x1) / 2 * SCALE, y * SCALE), COLOURS[colour], marker)
        texts.append((text, (x1 + pad, y)))
    return texts
