"""``model.weights`` is checked on the driver before Ray or MLflow start (issue #39): a preset
keras-hub cannot load, or one that is not an image encoder, is one line and exit 2, never a
worker's failure after the cluster started, nor a whole detector wrapped as a new detector's
encoder. The presets are written here by keras-hub's own ``save_to_preset`` (nothing can be
downloaded on this machine)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import REPO, run_cli

QUICKSTART = REPO / "configs" / "quickstart.yaml"
SWEEP = REPO / "sweeps" / "quickstart.yaml"
# A refusal imports keras-hub (and TensorFlow, about 5 s here) and nothing more; Ray's start
# and a trial's first step alone take longer (README, Speed).
SECONDS_TO_REFUSE = 40
EXPECTED = ("expected a keras-hub backbone preset: a folder a backbone's save_to_preset wrote, "
            "kaggle://owner/model/keras/variant[/version], hf://owner/name, or a keras-hub preset name "
            "such as resnet_50_imagenet")
NOT_YET = ("whole-detector presets are not supported yet as model.weights, expected a backbone preset "
           "(e.g. resnet_50_imagenet)")


@pytest.fixture(scope="module")
def presets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny image encoder's preset, and a whole RetinaNet's on it, as keras-hub saves them;
    a folder that holds no preset."""
    import keras_hub

    from detsweep.models.backbones import build_backbone

    folder = tmp_path_factory.mktemp("presets")
    encoder = build_backbone("resnet_tiny")
    encoder.save_to_preset(str(folder / "backbone"))
    backbone = keras_hub.models.RetinaNetBackbone(image_encoder=encoder, min_level=3, max_level=5, use_p5=False,
                                                  image_shape=(64, 64, 3))
    detector = keras_hub.models.RetinaNetObjectDetector(backbone=backbone, num_classes=2, bounding_box_format="yxyx")
    detector.save_to_preset(str(folder / "detector"))
    (folder / "no_preset").mkdir()
    (folder / "no_preset" / "model.weights.h5").write_bytes(b"")  # weights, but no config.json
    return {"backbone": folder / "backbone", "detector": folder / "detector", "no_preset": folder / "no_preset"}


def test_a_backbone_preset_saved_by_keras_hub_passes_validate(presets):
    result = run_cli("validate", str(SWEEP), "--set", f"base.model.weights={presets['backbone']}", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["base"]["model"]["weights"] == str(presets["backbone"])
    assert not [note for note in report["notes"] if "model.weights" in note], report["notes"]


REFUSALS = {
    "missing folder": ("{tmp}/gone", "a folder that does not exist; " + EXPECTED),
    "folder without a preset": ("{no_preset}", "a folder without a keras-hub preset (no config.json); " + EXPECTED),
    "whole-detector preset": ("{detector}", f"a whole-detector preset (RetinaNetObjectDetector); {NOT_YET}"),
    "short kaggle handle": ("kaggle://keras/resnet/keras",
                            "expected a Kaggle handle kaggle://owner/model/keras/variant[/version]"),
    "kaggle handle of another framework": ("kaggle://keras/resnet/pytorch/resnet_50_imagenet",
                                           "expected a Kaggle handle kaggle://owner/model/keras/variant[/version]"),
    "long hf handle": ("hf://owner/name/extra", "expected a Hugging Face handle hf://owner/name"),
    "unknown preset name": ("resnet_9000_imagenet", "neither a folder nor a keras-hub preset name; " + EXPECTED),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_each_bad_preset_is_named_with_what_was_found_and_what_was_expected(case, presets, tmp_path):
    from detsweep.errors import DetsweepError
    from detsweep.models.presets import check_backbone_preset

    weights, reason = (text.format(tmp=tmp_path, **presets) for text in REFUSALS[case])
    with pytest.raises(DetsweepError) as refused:
        check_backbone_preset(weights, "model.weights")
    assert str(refused.value) == f"model.weights: found {weights!r}, {reason}"


# Through the command: one case refused by its folder, one by its kind (each a TensorFlow import).
@pytest.mark.parametrize("case", ["missing folder", "whole-detector preset"])
def test_a_bad_preset_given_to_train_is_one_line_before_ray_starts(case, presets, tmp_path):
    weights, reason = (text.format(tmp=tmp_path, **presets) for text in REFUSALS[case])
    storage = tmp_path / "ray"
    # Ray makes its session folder under RAY_TMPDIR as it starts (a short path: its sockets live there)
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        started = time.monotonic()
        result = run_cli("train", str(QUICKSTART), "--set", f"model.weights={weights}", "--set", "train.num_steps=2",
                         "--set", "data.val=null", "--storage", str(storage), cwd=tmp_path,
                         env={"RAY_TMPDIR": str(ray_tmp)}, timeout=120)
        took = time.monotonic() - started
        assert not any(ray_tmp.iterdir()), sorted(path.name for path in ray_tmp.rglob("*"))[:20]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert (result.returncode, result.stderr) == (
        2, f"detsweep: error: {QUICKSTART}: model.weights: found {weights!r}, {reason}\n")
    assert not storage.exists() and not (tmp_path / "mlflow.db").exists()
    assert took < SECONDS_TO_REFUSE, f"refused after {took:.0f} s"


def test_a_whole_detector_preset_is_refused_by_validate_and_launch_before_anything_starts(presets, tmp_path):
    """A sweep names the field in its base; ``launch`` refuses before its MLflow run and Ray."""
    expected = (f"detsweep: error: {SWEEP}: base.model.weights: found '{presets['detector']}', "
                f"a whole-detector preset (RetinaNetObjectDetector); {NOT_YET}\n")
    weights = f"base.model.weights={presets['detector']}"
    validated = run_cli("validate", str(SWEEP), "--set", weights, cwd=tmp_path)
    assert (validated.returncode, validated.stderr) == (2, expected)
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        launched = run_cli("launch", str(SWEEP), "--set", weights, "--set", f"storage={tmp_path / 'ray'}",
                           cwd=tmp_path, env={"RAY_TMPDIR": str(ray_tmp)}, timeout=120)
        assert not any(ray_tmp.iterdir()), sorted(path.name for path in ray_tmp.rglob("*"))[:20]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert (launched.returncode, launched.stderr) == (2, expected)
    assert not list(tmp_path.iterdir())  # no results folder, no mlflow.db, no log


def test_keras_hubs_own_detector_presets_and_other_backbones_are_refused_by_name():
    """Names from keras-hub's registry: a RetinaNet preset is a whole detector, BERT's is no image
    encoder. Both would otherwise be found only in the workers, after downloading."""
    from detsweep.errors import DetsweepError
    from detsweep.models.presets import check_backbone_preset

    refusals = {"retinanet_resnet50_fpn_coco": f"a whole-detector preset (a keras-hub ObjectDetector's); {NOT_YET}",
                "bert_base_en": "a keras-hub preset of another kind of backbone; expected one of an image encoder "
                                "with a feature pyramid (e.g. resnet_50_imagenet)"}
    for name, reason in refusals.items():
        with pytest.raises(DetsweepError) as refused:
            check_backbone_preset(name, "base.model.weights")
        assert str(refused.value) == f"base.model.weights: found {name!r}, {reason}"
    assert check_backbone_preset("resnet_50_imagenet", "base.model.weights") == []


def test_a_preset_folder_sized_for_a_cluster_config_is_left_to_its_nodes(tmp_path):
    """Before ``ray up`` the nodes' folders cannot be looked at from here: a note, as for data."""
    result = run_cli("validate", str(SWEEP), "--set", f"base.model.weights={tmp_path / 'on_the_nodes'}",
                     "--cluster-config", str(REPO / "ray_cluster.yaml"), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"left to the nodes, which must have it: base.model.weights: {tmp_path / 'on_the_nodes'}" in json.loads(result.stdout)["notes"]
