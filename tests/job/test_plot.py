"""The reward plot: a valid PNG of the right size, markers where the steps say."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from PIL import Image

from rollout_recovery.job._plot import (
    CHECKPOINT_COLOUR,
    PLOT_SIZE,
    RESTART_COLOUR,
    REWARD_COLOUR,
    PlotFrame,
    plot_frame,
    write_reward_plot,
)

STEPS = list(range(1, 21))
REWARDS = [0.2 + 0.03 * step for step in STEPS]

Colour = tuple[int, int, int]


def _draw(
    path: Path,
    *,
    steps: list[int] = STEPS,
    rewards: list[float] = REWARDS,
    restarts: tuple[int, ...] = (),
    checkpoints: tuple[int, ...] = (),
) -> tuple[Image.Image, PlotFrame]:
    write_reward_plot(
        path,
        steps=steps,
        mean_rewards=rewards,
        restarts=restarts,
        checkpoints=checkpoints,
        title="test run",
    )
    with Image.open(path) as image:
        assert image.format == "PNG"
        loaded = image.convert("RGB")
    frame = plot_frame(
        steps=steps, mean_rewards=rewards, restarts=restarts, checkpoints=checkpoints
    )
    return loaded, frame


def _column_count(image: Image.Image, frame: PlotFrame, x: int, colour: Colour) -> int:
    """Pixels of ``colour`` in column ``x`` inside the plotting area."""
    return sum(image.getpixel((x, y)) == colour for y in range(frame.top, frame.bottom + 1))


def _area_count(image: Image.Image, frame: PlotFrame, colour: Colour) -> int:
    return sum(_column_count(image, frame, x, colour) for x in range(frame.left, frame.right + 1))


def test_the_plot_is_a_valid_png_of_the_documented_size(tmp_path: Path) -> None:
    path = tmp_path / "reward.png"
    _draw(path, restarts=(7,), checkpoints=(5, 10))
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.size == PLOT_SIZE == (800, 450)
    assert [p.name for p in tmp_path.iterdir()] == ["reward.png"]  # no temporary left


def test_a_restart_draws_a_dashed_line_in_the_restart_colour(tmp_path: Path) -> None:
    image, frame = _draw(tmp_path / "reward.png", restarts=(7,))
    height = frame.bottom - frame.top
    on_line = _column_count(image, frame, frame.x_of(7), RESTART_COLOUR)
    # Dashed: well over a third of the column, but not all of it.
    assert height // 3 < on_line < height
    assert _column_count(image, frame, frame.x_of(3), RESTART_COLOUR) == 0
    assert _column_count(image, frame, frame.x_of(15), RESTART_COLOUR) == 0


def test_without_restarts_no_restart_colour_is_in_the_plotting_area(tmp_path: Path) -> None:
    image, frame = _draw(tmp_path / "reward.png", checkpoints=(5,))
    assert _area_count(image, frame, RESTART_COLOUR) == 0


def test_checkpoints_are_marked_on_the_step_axis(tmp_path: Path) -> None:
    image, frame = _draw(tmp_path / "reward.png", checkpoints=(5, 10))
    for step in (5, 10):
        assert image.getpixel((frame.x_of(step), frame.bottom - 3)) == CHECKPOINT_COLOUR
    assert image.getpixel((frame.x_of(8), frame.bottom - 3)) != CHECKPOINT_COLOUR
    bare, bare_frame = _draw(tmp_path / "bare.png")
    assert _area_count(bare, bare_frame, CHECKPOINT_COLOUR) == 0


def test_every_reward_point_is_drawn_where_its_step_and_reward_map(tmp_path: Path) -> None:
    image, frame = _draw(tmp_path / "reward.png")
    for step, reward in zip(STEPS, REWARDS, strict=True):
        assert image.getpixel((frame.x_of(step), frame.y_of(reward))) == REWARD_COLOUR


def test_a_nan_reward_is_skipped_and_breaks_the_line(tmp_path: Path) -> None:
    rewards = list(REWARDS)
    rewards[9] = math.nan  # step 10
    image, frame = _draw(tmp_path / "reward.png", rewards=rewards)
    assert _column_count(image, frame, frame.x_of(10), REWARD_COLOUR) == 0
    assert _column_count(image, frame, frame.x_of(9), REWARD_COLOUR) > 0
    assert _column_count(image, frame, frame.x_of(11), REWARD_COLOUR) > 0


def test_the_reward_range_covers_zero_to_one_and_the_data() -> None:
    frame = plot_frame(steps=[1, 2], mean_rewards=[0.4, 0.6])
    assert (frame.reward_min, frame.reward_max) == (0.0, 1.0)
    frame = plot_frame(steps=[1, 2, 3], mean_rewards=[-0.5, math.nan, 1.5])
    assert (frame.reward_min, frame.reward_max) == (-0.5, 1.5)
    assert frame.y_of(-0.5) == frame.bottom
    assert frame.y_of(1.5) == frame.top


def test_rewards_outside_zero_to_one_stay_inside_the_image(tmp_path: Path) -> None:
    image, frame = _draw(tmp_path / "reward.png", steps=[1, 2, 3], rewards=[-2.0, 0.5, 3.0])
    assert image.getpixel((frame.x_of(1), frame.y_of(-2.0))) == REWARD_COLOUR
    assert image.getpixel((frame.x_of(3), frame.y_of(3.0))) == REWARD_COLOUR


def test_no_steps_draws_an_empty_chart(tmp_path: Path) -> None:
    image, frame = _draw(tmp_path / "reward.png", steps=[], rewards=[])
    assert image.size == PLOT_SIZE
    assert _area_count(image, frame, REWARD_COLOUR) == 0


def test_one_step_draws_its_point(tmp_path: Path) -> None:
    image, frame = _draw(tmp_path / "reward.png", steps=[3], rewards=[0.4], checkpoints=(3,))
    assert frame.left < frame.x_of(3) < frame.right
    assert image.getpixel((frame.x_of(3), frame.y_of(0.4))) == REWARD_COLOUR


def test_restarts_outside_the_plotted_steps_widen_the_axis(tmp_path: Path) -> None:
    image, frame = _draw(tmp_path / "reward.png", steps=[1, 2], rewards=[0.1, 0.2], restarts=(5,))
    assert frame.step_max == 5
    assert _column_count(image, frame, frame.x_of(5), RESTART_COLOUR) > 0


def test_the_plot_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "reward.png"
    path.write_bytes(b"stale")
    _draw(path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_mismatched_lengths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        write_reward_plot(
            tmp_path / "reward.png",
            steps=[1, 2],
            mean_rewards=[0.5],
            restarts=[],
            checkpoints=[],
            title="bad",
        )
    assert not (tmp_path / "reward.png").exists()
