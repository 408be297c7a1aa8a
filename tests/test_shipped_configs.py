"""The configs we ship validate, and their data loads as described."""

import json

import pytest

from detsweep.config import load_trial_config
from detsweep.preflight.checks import read_data

from .conftest import REPO, run_cli

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_validates(path):
    config = load_trial_config(path)
    assert config.data.val is not None  # every shipped config evaluates on held-out data


def test_raccoon_config_splits_160_train_40_val():
    lines = read_data(load_trial_config(REPO / "configs" / "raccoon.yaml"))
    assert "[0:160]: 160 images, 173 boxes, 1 category" in lines[0]  # the summary names the subset
    assert "[160:200]: 40 images, 44 boxes" in lines[1]
    config = load_trial_config(REPO / "configs" / "raccoon.yaml")
    from detsweep.data import load_dataset

    train, val = load_dataset(config.data.train, verify=False), load_dataset(config.data.val, verify=False)
    assert (len(train.examples), len(val.examples)) == (160, 40)
    assert not {e.file_name for e in train.examples} & {e.file_name for e in val.examples}


def test_data_inspect_through_the_main_command():
    raccoon = REPO.parent / "shared" / "datasets" / "raccoon"
    result = run_cli("data", "inspect", "--format", "voc", "--annotations", str(raccoon / "annotations"),
                     "--images", str(raccoon / "images"), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["images"], summary["boxes"]) == (200, 217)
    assert summary["per_category"] == {"raccoon": 217}


def test_bad_subset_is_a_config_error(tmp_path):
    result = run_cli("config", str(REPO / "configs" / "raccoon.yaml"), "--set", "data.val.subset=[40, 10]")
    assert result.returncode == 2 and "data.val.subset: found [40, 10]" in result.stderr
