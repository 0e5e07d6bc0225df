"""reward_curve.png, drawn with Pillow: the axes' limits and ticks, dashes, broken lines, and where the curves land."""

import json
import math
import subprocess
import sys

from PIL import Image

from grpokit.records.plot import LOSS_BOX, REWARD_BOX, Panel, _dashes, data_range, plot_run, tick_label, ticks


def test_limits_widen_the_data_by_five_percent_and_centre_a_flat_line():
    assert data_range([0.0, 1.0, math.nan]) == (-0.05, 1.05)
    assert data_range([3.0, 3.0]) == (1.5, 4.5)  # ± half of the value
    assert data_range([0.0]) == (-0.5, 0.5)
    assert data_range([]) == (-0.5, 0.5)


def test_ticks_fall_on_round_multiples_inside_the_limits():
    assert ticks(0.06, 0.94, count=5) == [0.2, 0.4, 0.6, 0.8]  # 0.88 / 5 = 0.176 -> 0.2
    assert ticks(0.6, 9.4, integer=True) == [2, 4, 6, 8]  # 8.8 / 6 = 1.47 -> 2
    assert ticks(-0.5, 0.5, count=4) == [-0.5, -0.25, 0.0, 0.25, 0.5]  # 1 / 4 = 0.25 -> 2.5 x 0.1
    assert ticks(0.9, 3.1, integer=True) == [1, 2, 3]  # 0.37 -> 0.5, raised to one step


def test_tick_labels_have_the_decimals_of_their_step():
    assert tick_label(0.25, 0.25) == "0.25"
    assert tick_label(-0.5, 0.25) == "-0.50"
    assert tick_label(4.0, 2.0) == "4"
    assert tick_label(0.4, 0.2) == "0.4"
    assert tick_label(5e-4, 2.5e-4) == "5.0e-04"  # a step below 1e-3: scientific
    assert tick_label(0.0, 2.5e-4) == "0"


def test_dashes_follow_the_pattern_and_turn_corners():
    assert _dashes([(0, 0), (10, 0)], [3, 2]) == [[(0, 0), (3.0, 0.0)], [(5.0, 0.0), (8.0, 0.0)]]
    assert _dashes([(0, 0), (2, 0), (2, 2)], [3, 1]) == [[(0, 0), (2, 0), (2.0, 1.0)]]


def test_a_line_breaks_at_values_that_are_not_finite():
    panel = Panel((0, 0, 10, 10), (0, 10), (0, 10))
    pieces = panel.pieces([1, 2, 3, 4], [0, math.nan, 1, 1])
    assert pieces == [[panel.at(1, 0)], [panel.at(3, 1), panel.at(4, 1)]]
    assert panel.at(1, 0) == (2.0, 20.0)  # SCALE 2: x 1 -> 2, y 0 at the bottom (10 -> 20)


def _colour_near(pixel, colour, tolerance=40):
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, colour, strict=True))


def test_the_curves_land_where_the_axes_put_them(tmp_path):
    """Steps 1-9, reward step/10 without spread, loss 0: the reward panel's limits are [0.6, 9.4] x [0.06, 0.94],
    so (5, 0.5) is at x 91 + 4.4/8.8 x 588 = 385, y 318 - 0.44/0.88 x 266 = 185; the loss panel's y limits are
    [-0.5, 0.5] (a flat line), so loss 0 is at its middle, y (358 + 552) / 2 = 455."""
    assert REWARD_BOX == (91, 52, 679, 318) and LOSS_BOX == (91, 358, 679, 552)
    rows = [{"step": s, "reward": s / 10, "reward_std": 0.0, "loss": 0.0} for s in range(1, 10)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    image = Image.open(plot_run(str(tmp_path))).convert("RGB")
    assert image.size == (700, 600)
    assert _colour_near(image.getpixel((385, 185)), (31, 119, 180))  # the reward line
    assert image.getpixel((385, 165)) == (255, 255, 255)  # 20 px above it: nothing (no grid line at y 0.6 -> 155)
    assert _colour_near(image.getpixel((385, 455)), (214, 39, 40))  # the loss line
    assert image.getpixel((385, 435)) == (255, 255, 255)


def test_the_sampler_panel_appears_when_the_run_logged_the_mismatch(tmp_path):
    """Rows with sampler/ratio/*: a third panel below the loss (the image grows to 800 px); a constant ratio of 1 puts
    its median at the middle of the panel's [0.5, 1.5] limits, y (598 + 752) / 2 = 675, drawn in teal."""
    rows = [
        {"step": s, "reward": s / 10, "loss": 0.0, "sampler/ratio/p05": 1.0, "sampler/ratio/p50": 1.0,
         "sampler/ratio/p95": 1.0}
        for s in range(1, 10)
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    image = Image.open(plot_run(str(tmp_path))).convert("RGB")
    assert image.size == (700, 800)
    assert _colour_near(image.getpixel((385, 675)), (23, 190, 207))
    assert image.getpixel((385, 655)) == (255, 255, 255)
    rows = [{k: v for k, v in r.items() if not k.startswith("sampler/")} for r in rows]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert Image.open(plot_run(str(tmp_path))).size == (700, 600)  # no mismatch logged: two panels


def test_a_run_never_imports_matplotlib(tmp_path):
    """The plot is drawn without matplotlib: its import alone cost 0.3-0.4 s of train()."""
    rows = [{"step": s, "reward": 0.1 * s, "loss": 0.0, "eval_reward": 0.2} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = (
        "import sys; from grpokit.records.plot import plot_run; "
        f"plot_run({str(tmp_path)!r}); print('matplotlib' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
