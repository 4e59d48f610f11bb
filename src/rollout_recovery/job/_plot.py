"""The reward plot: mean reward per step, with restarts and checkpoints marked (PNG).

Drawn with Pillow only (no plotting library): axes with tick labels, the reward line with
its points, a dashed vertical line at every restart, a small marker on the x axis at every
checkpoint, a legend and a title. The file is replaced atomically, so a reader (or a crash
mid-write) never sees a torn PNG.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from rollout_recovery._durable import atomic_write_bytes

from ..errors import InvalidArgumentError

__all__ = [
    "AXIS_COLOUR",
    "BACKGROUND_COLOUR",
    "CHECKPOINT_COLOUR",
    "PLOT_SIZE",
    "RESTART_COLOUR",
    "REWARD_COLOUR",
    "PlotFrame",
    "plot_frame",
    "write_reward_plot",
]

PLOT_SIZE = (800, 450)
BACKGROUND_COLOUR = (255, 255, 255)
AXIS_COLOUR = (40, 40, 40)
GRID_COLOUR = (228, 228, 228)
TEXT_COLOUR = (20, 20, 20)
NOTE_COLOUR = (120, 120, 120)
REWARD_COLOUR = (31, 119, 180)
RESTART_COLOUR = (214, 39, 40)
CHECKPOINT_COLOUR = (44, 160, 44)

# Margins around the plotting area: room for the title, the tick labels and the legend.
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 24, 44, 56
_DASH, _GAP = 6, 4
_TICKS = 6

_Font = ImageFont.ImageFont | ImageFont.FreeTypeFont | ImageFont.TransposedFont


@dataclass(frozen=True, slots=True)
class PlotFrame:
    """The mapping from data (step, reward) to pixels, and the data ranges it shows."""

    left: int
    top: int
    right: int
    bottom: int
    step_min: float
    step_max: float
    reward_min: float
    reward_max: float

    def x_of(self, step: float) -> int:
        span = self.step_max - self.step_min
        return round(self.left + (step - self.step_min) / span * (self.right - self.left))

    def y_of(self, reward: float) -> int:
        span = self.reward_max - self.reward_min
        return round(self.bottom - (reward - self.reward_min) / span * (self.bottom - self.top))


def plot_frame(
    *,
    steps: Sequence[int],
    mean_rewards: Sequence[float],
    restarts: Sequence[int] = (),
    checkpoints: Sequence[int] = (),
    size: tuple[int, int] = PLOT_SIZE,
) -> PlotFrame:
    """The frame ``write_reward_plot`` draws in.

    Steps span every step, restart and checkpoint given (padded by one step each side
    when that is a single step, [0, 1] when there is none); rewards span
    [min(0, data), max(1, data)], NaN and infinities ignored.
    """
    width, height = size
    marks = [*steps, *restarts, *checkpoints]
    if marks:
        step_min, step_max = float(min(marks)), float(max(marks))
    else:
        step_min, step_max = 0.0, 1.0
    if step_min == step_max:
        step_min, step_max = step_min - 1.0, step_max + 1.0
    finite = [float(r) for r in mean_rewards if math.isfinite(r)]
    reward_min = min([0.0, *finite])
    reward_max = max([1.0, *finite])
    return PlotFrame(
        left=_LEFT,
        top=_TOP,
        right=width - _RIGHT,
        bottom=height - _BOTTOM,
        step_min=step_min,
        step_max=step_max,
        reward_min=reward_min,
        reward_max=reward_max,
    )


def write_reward_plot(
    path: Path,
    *,
    steps: Sequence[int],
    mean_rewards: Sequence[float],
    restarts: Sequence[int],
    checkpoints: Sequence[int],
    title: str,
) -> None:
    """Draw mean reward per step as an ~800x450 PNG and replace ``path`` with it atomically.

    ``steps[i]`` pairs with ``mean_rewards[i]``; NaN (and infinite) rewards are skipped,
    breaking the line. ``restarts`` are the steps a run resumed at, ``checkpoints`` the
    steps a checkpoint was written at. No plotted step draws an empty chart with a note.
    """
    if len(steps) != len(mean_rewards):
        raise InvalidArgumentError(
            f"steps and mean_rewards differ in length: {len(steps)} != {len(mean_rewards)}"
        )
    frame = plot_frame(
        steps=steps, mean_rewards=mean_rewards, restarts=restarts, checkpoints=checkpoints
    )
    image = Image.new("RGB", PLOT_SIZE, BACKGROUND_COLOUR)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()

    _draw_axes(draw, font, frame)
    for step in sorted(set(restarts)):
        _draw_dashed_vertical(draw, frame.x_of(step), frame.top, frame.bottom, RESTART_COLOUR)
    for step in sorted(set(checkpoints)):
        x = frame.x_of(step)
        draw.line([(x, frame.bottom - 8), (x, frame.bottom)], fill=CHECKPOINT_COLOUR, width=3)
        draw.polygon(
            [(x, frame.bottom - 10), (x - 5, frame.bottom - 17), (x + 5, frame.bottom - 17)],
            fill=CHECKPOINT_COLOUR,
        )
    points = [
        (frame.x_of(step), frame.y_of(float(reward)))
        for step, reward in zip(steps, mean_rewards, strict=True)
        if math.isfinite(reward)
    ]
    _draw_reward(draw, frame, steps, mean_rewards)
    for x, y in points:
        draw.ellipse([(x - 3, y - 3), (x + 3, y + 3)], fill=REWARD_COLOUR)
    if not points:
        _place_text(
            draw,
            font,
            (frame.left + frame.right) // 2,
            (frame.top + frame.bottom) // 2,
            "no reward recorded yet",
            NOTE_COLOUR,
        )
    elif len(points) == 1:
        _place_text(
            draw,
            font,
            (frame.left + frame.right) // 2,
            frame.top + 12,
            "only one step so far",
            NOTE_COLOUR,
        )
    _place_text(draw, font, PLOT_SIZE[0] // 2, 12, title, TEXT_COLOUR)
    _draw_legend(draw, font, frame)

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())


def _draw_reward(
    draw: ImageDraw.ImageDraw,
    frame: PlotFrame,
    steps: Sequence[int],
    mean_rewards: Sequence[float],
) -> None:
    """The reward line, in steps order, broken wherever a reward is not finite."""
    segment: list[tuple[int, int]] = []
    for step, reward in sorted(zip(steps, mean_rewards, strict=True), key=lambda p: p[0]):
        if not math.isfinite(reward):
            if len(segment) > 1:
                draw.line(segment, fill=REWARD_COLOUR, width=2)
            segment = []
            continue
        segment.append((frame.x_of(step), frame.y_of(float(reward))))
    if len(segment) > 1:
        draw.line(segment, fill=REWARD_COLOUR, width=2)


def _draw_axes(draw: ImageDraw.ImageDraw, font: _Font, frame: PlotFrame) -> None:
    for value in _ticks(frame.reward_min, frame.reward_max):
        y = frame.y_of(value)
        draw.line([(frame.left, y), (frame.right, y)], fill=GRID_COLOUR, width=1)
        draw.line([(frame.left - 5, y), (frame.left, y)], fill=AXIS_COLOUR, width=1)
        label = f"{value:.2f}"
        _place_text(draw, font, frame.left - 8, y, label, TEXT_COLOUR, align="right")
    for value in _ticks(frame.step_min, frame.step_max, integer=True):
        x = frame.x_of(value)
        draw.line([(x, frame.bottom), (x, frame.bottom + 5)], fill=AXIS_COLOUR, width=1)
        _place_text(draw, font, x, frame.bottom + 14, f"{value:g}", TEXT_COLOUR)
    draw.line([(frame.left, frame.top), (frame.left, frame.bottom)], fill=AXIS_COLOUR, width=1)
    draw.line([(frame.left, frame.bottom), (frame.right, frame.bottom)], fill=AXIS_COLOUR, width=1)
    _place_text(draw, font, (frame.left + frame.right) // 2, frame.bottom + 34, "step", TEXT_COLOUR)
    _place_text(draw, font, 6, frame.top - 12, "mean reward", TEXT_COLOUR, align="left")


def _ticks(low: float, high: float, *, integer: bool = False) -> list[float]:
    """About ``_TICKS`` round values in [low, high] (steps of 1, 2 or 5 times 10^k)."""
    raw = (high - low) / (_TICKS - 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1.0, 2.0, 5.0, 10.0) if m * magnitude >= raw)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(low / step - 1e-9)
    values: list[float] = []
    index = first
    while index * step <= high + 1e-9 * step:
        values.append(round(index * step, 10))
        index += 1
    return values


def _draw_dashed_vertical(
    draw: ImageDraw.ImageDraw,
    x: int,
    top: int,
    bottom: int,
    colour: tuple[int, int, int],
    *,
    dash: int = _DASH,
    gap: int = _GAP,
) -> None:
    y = top
    while y < bottom:
        draw.line([(x, y), (x, min(y + dash, bottom))], fill=colour, width=2)
        y += dash + gap


def _draw_legend(draw: ImageDraw.ImageDraw, font: _Font, frame: PlotFrame) -> None:
    """One row of three entries in the top margin, right-aligned above the plotting area.

    Outside the plotting area, so it never hides a point or a marker.
    """
    entries = ["mean reward", "restart", "checkpoint"]
    swatch, gap = 22, 16
    widths = [_text_size(draw, font, entry)[0] for entry in entries]
    total = sum(swatch + 6 + width for width in widths) + gap * (len(entries) - 1)
    x0 = frame.right - total
    y = frame.top - 12
    for entry, width in zip(entries, widths, strict=True):
        x1 = x0 + swatch
        if entry == "mean reward":
            draw.line([(x0, y), (x1, y)], fill=REWARD_COLOUR, width=2)
            draw.ellipse([(x0 + 8, y - 3), (x0 + 14, y + 3)], fill=REWARD_COLOUR)
        elif entry == "restart":
            _draw_dashed_vertical(draw, x0 + 11, y - 7, y + 7, RESTART_COLOUR, dash=4, gap=3)
        else:
            draw.polygon(
                [(x0 + 11, y + 4), (x0 + 6, y - 3), (x0 + 16, y - 3)], fill=CHECKPOINT_COLOUR
            )
        _place_text(draw, font, x1 + 6, y, entry, TEXT_COLOUR, align="left")
        x0 = x1 + 6 + width + gap


def _text_size(draw: ImageDraw.ImageDraw, font: _Font, text: str) -> tuple[int, int]:
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    return round(right - left), round(bottom - top)


def _place_text(
    draw: ImageDraw.ImageDraw,
    font: _Font,
    x: int,
    y: int,
    text: str,
    colour: tuple[int, int, int],
    *,
    align: str = "centre",
) -> None:
    """Text vertically centred on ``y``; ``x`` is its left edge, centre or right edge.

    Positioned from its bounding box rather than with ``anchor=``, which Pillow's bitmap
    fallback font (used when FreeType is missing) does not support.
    """
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    width = right - left
    start = {"left": x, "centre": x - width / 2, "right": x - width}[align]
    origin = (round(start - left), round(y - (top + bottom) / 2))
    draw.text(origin, text, fill=colour, font=font)
