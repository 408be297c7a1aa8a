"""`detsweep optimizer`: the report a user reads before training."""

import json

import pytest
from matplotlib import image

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
    pixels = image.imread(plot)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 600
    assert pixels[..., :3].std() > 0.05  # something was drawn


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
