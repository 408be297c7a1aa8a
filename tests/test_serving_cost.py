"""What an architecture costs to serve, before training (``export/architecture.py``): one key
per network, and the suppression fed the same number of candidates whatever the weights."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from detsweep.config import ModelConfig
from detsweep.export.architecture import CANDIDATES, serving_cost
from detsweep.models import build_model

from .conftest import REPO, run_bounded


def test_two_configs_share_a_key_exactly_when_their_networks_are_alike():
    base = ModelConfig(image_size=64, max_level=5)
    assert base.architecture_key(3) == base.model_copy(update={"score_threshold": 0.3,
                                                               "focal_gamma": 1.0}).architecture_key(3)
    others = [base.model_copy(update=change) for change in ({"head_conv_layers": 1}, {"image_size": 96},
                                                            {"aspect_ratios": (1.0,)}, {"backbone": "resnet18"})]
    keys = {base.architecture_key(3), base.architecture_key(4), *(other.architecture_key(3) for other in others)}
    assert len(keys) == 6


def test_a_trial_finds_its_architectures_serving_cost_without_importing_tensorflow():
    """A trial's process looks its architecture's cost up before Ray Train starts its workers,
    in every sweep, measured or not: TensorFlow imported there cost each trial's start about
    6 s (``bench/startup.py``'s trainer phase), for nothing the trial's process uses."""
    import json
    import sys

    script = """
import json, sys
from detsweep.config import load_trial_config
from detsweep.trainables.trial import serving_cost
config = load_trial_config(sys.argv[1])
key = config.model.architecture_key(config.model.num_classes or 0)
found = [serving_cost({"serving": {key: [["serve/params", 5.0]]}}, config), serving_cost({}, config)]
print(json.dumps([found, "tensorflow" in sys.modules]))
"""
    result = run_bounded([sys.executable, "-c", script, str(REPO / "configs" / "quickstart.yaml")], timeout=120,
                         cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == [[{"serve/params": 5.0}, {}], False]


@pytest.mark.parametrize("bias", [-12.0, 12.0], ids=["untrained-like: no score above 0.05", "every score high"])
def test_the_cost_models_suppression_takes_the_same_candidates_whatever_the_weights(bias):
    """A network scoring nothing above the threshold and one scoring everything high give the
    suppression the same ``CANDIDATES`` boxes in the cost model; served normally, they differ."""
    config = ModelConfig(image_size=128, max_level=5, class_prediction_bias_init=bias, head_kernel_stddev=0.001)
    network, _ = build_model(config, 3)
    decoder = network.prediction_decoder
    scores = tf.sigmoid(network(tf.zeros([1, 128, 128, 3]), training=False)["cls_logits"])
    anchors = int(scores.shape[1])
    served = decoder._best_above_threshold(tf.reduce_max(scores, -1))[0].shape[-1]
    decoder.confidence_threshold, decoder.max_candidates = 0.0, CANDIDATES
    costed = decoder._best_above_threshold(tf.reduce_max(scores, -1))[0].shape[-1]
    assert anchors > CANDIDATES and costed == CANDIDATES
    assert served == (1 if bias < 0 else anchors)


def test_serving_cost_times_the_architectures_tflite_file():
    cost = serving_cost(ModelConfig(image_size=64, max_level=5, head_conv_layers=0), 3)
    assert cost.latency_ms > 0 and cost.latency.runs >= 30 and cost.size_mb > 1 and cost.params > 10**6
    assert set(cost.metrics()) == {"serve/latency_ms", "serve/size_mb", "serve/params"}
    assert np.isclose(cost.metrics()["serve/params"], cost.params)
    # the file holds every weight in float32, as a trained network's would (none shared alike)
    assert cost.size_mb * 1e6 >= 4 * cost.params, (cost.size_mb, cost.params)


def test_a_sweep_asking_for_int8_measures_each_architectures_int8_file_too(write):
    """``search.serving_cost: int8`` (or a constraint or objective on an int8 cost): each
    architecture's int8 file, calibrated on noise, is measured beside its float one: a quarter
    of the size or less (int8 weights), and its latency timed the same way."""
    from detsweep.sweeps import load_sweep
    from detsweep.sweeps.serving import measure_architectures

    from .conftest import REPO

    sweep = load_sweep(write("sweep.yaml", f"""
name: int8-cost
base:
  from: {REPO / "configs" / "quickstart.yaml"}
  data: {{train: {{num_images: 8}}, val: {{num_images: 8}}}}
  model: {{image_size: 64}}
search:
  constraints: ["serve/int8_latency_ms <= 1000"]
  space:
    model.head_conv_layers: {{values: [0]}}
"""))
    assert sweep.search.measures_int8
    said = []
    [cost] = measure_architectures(sweep, said.append).values()
    assert set(cost) == {"serve/latency_ms", "serve/size_mb", "serve/params", "serve/int8_latency_ms",
                         "serve/int8_size_mb"}
    assert 0 < cost["serve/int8_size_mb"] <= cost["serve/size_mb"] / 3.5 and cost["serve/int8_latency_ms"] > 0
    assert said[0].startswith("serving cost of model.head_conv_layers=0: ") and "; int8 " in said[0], said
