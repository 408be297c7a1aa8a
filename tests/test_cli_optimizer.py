"""`detsweep optimizer`: the report a user reads before training."""

import json

import numpy as np
import pytest
from matplotlib import image
from matplotlib.colors import to_rgb

from detsweep.cli import main, parse_steps

from .conftest import REPO

QUICKSTART = str(REPO / "configs" / "quickstart.yaml")


def test_json_report_has_exactly_the_documented_keys(capsys):
    assert main(["optimizer", QUICKSTART, "--json", "--steps", "0:31:10"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"optimizer", "hyperparameters", "moving_average", "steps", "learning_rate"}
    assert report["optimizer"] == "SGD"
    assert "learning_rate" not in report["hyperparameters"]
    assert report["hyperparameters"]["momentum"] == pytest.approx(0.9)
    assert report["moving_average"] == {"enabled": True, "decay": 0.99, "dynamic": True}
    assert report["steps"] == [0, 10, 20, 30]
    assert report["learning_rate"] == pytest.approx([0.004, 0.016, 0.028, 0.04], rel=1e-5)


def test_text_report_and_plot(tmp_path, capsys):
    plot = tmp_path / "lr.png"
    assert main(["optimizer", QUICKSTART, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "keras.optimizers.SGD" in out and "cosine" in out and "on, decay 0.99 (dynamic warm-up)" in out
    pixels = image.imread(plot)[..., :3]
    assert pixels.shape[0] > 300 and pixels.shape[1] > 600
    # The warm-up (steps 0-30 of 600) shaded: a band of its colour (tab:orange at alpha 0.18 on
    # white) from the axes' left edge, as wide as 30 steps of the axes' width (their frame's
    # two long vertical lines bound it).
    shade = 0.82 + 0.18 * np.array(to_rgb("tab:orange"))
    band = columns_mostly(np.abs(pixels - shade).max(axis=-1) < 0.02)
    left, right = columns_mostly(pixels.max(axis=-1) < 0.3)[[0, -1]]
    assert len(band) > 0 and (band == np.arange(band[0], band[-1] + 1)).all(), band  # one band, unbroken
    # (the frame's line, a pixel or two wide, is drawn over the band's first columns)
    assert band[0] - left <= 3 and abs(band[-1] + 1 - left - (right - left) * 30 / 600) <= 2, (left, right, band)


def columns_mostly(mask: np.ndarray) -> np.ndarray:
    """The columns of a picture where ``mask`` holds for more than half the rows."""
    return np.flatnonzero(mask.mean(axis=0) > 0.5)


def test_moving_average_off_reports_no_decay(capsys):
    assert main(["optimizer", QUICKSTART, "--json", "--steps", "0", "--set", "optimizer.use_moving_average=false"]) == 0
    assert json.loads(capsys.readouterr().out)["moving_average"] == {"enabled": False, "decay": None, "dynamic": False}


@pytest.mark.parametrize("text, steps", [("0,4,8", [0, 4, 8]), ("0:5", [0, 1, 2, 3, 4]), ("10:40:10", [10, 20, 30])])
def test_parse_steps(text, steps):
    assert parse_steps(text) == steps


@pytest.mark.parametrize("text", ["", "1:2:0", "a", "-1,2", "5:1"])
def test_parse_steps_rejects(text, capsys):
    assert main(["optimizer", QUICKSTART, f"--steps={text}"]) == 2
    assert "--steps" in capsys.readouterr().err
