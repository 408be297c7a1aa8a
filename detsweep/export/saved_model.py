"""A checkpoint as a TensorFlow SavedModel that serves whole pictures, as the OD API's exports do.

The ``serving_default`` signature takes ``images``: uint8 ``[batch, height, width, 3]``, any
size (one per batch). Everything a client would otherwise copy from detsweep is in the graph:
the pipeline's resize, pad and normalise, the model with its box decoding and NMS, and the
way back to normalised ``ymin, xmin, ymax, xmax`` of the original image and the dataset's own
category ids. It returns ``detection_boxes`` float32 ``[batch, N, 4]`` (clipped to [0, 1]),
``detection_classes`` int64 ``[batch, N]`` (the OD API gives float32; an id is an integer),
``detection_scores`` float32 ``[batch, N]`` and ``num_detections`` int64 ``[batch]``; rows past
``num_detections`` are zeros. The graph is :func:`~detsweep.data.processing.detect_pictures`,
which :class:`~detsweep.export.detector.Detector` runs too and whose mapping back to the
original image training's evaluation uses: boxes partly outside the image are clipped, boxes
left with no area and labels of no category are dropped, in all three alike.

Beside the model, ``config.yaml`` (the checkpoint's as-run config) and ``detsweep.json``
(category ids and names, the step, whether the weights are the moving average), so that
``detsweep predict`` can name the classes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import tensorflow as tf

from detsweep.checkpoints import CONFIG_FILE
from detsweep.data.processing import InputSpec, detect_pictures
from detsweep.train.restore import load_trained_model

from .paths import INFO_FILE, check_new_folder, staged_folder

SIGNATURE = "serving_default"


def export_saved_model(checkpoint_dir: str | Path, out_dir: str | Path, use_average: bool = True) -> Path:
    """Write the checkpoint's model (its moving average with ``use_average``, when it has one)
    as a SavedModel into ``out_dir``, a new or empty folder."""
    out = Path(out_dir)
    check_new_folder(out)  # before the slow part
    trained = load_trained_model(checkpoint_dir)
    averaged = use_average and trained.moving_average is not None
    if averaged:
        trained.moving_average.swap()
    module = DetectionModule(trained.model, InputSpec.of(trained.config.model), [c.id for c in trained.categories])
    with staged_folder(out) as folder:
        tf.saved_model.save(module, str(folder), signatures={SIGNATURE: module.serve})
        shutil.copyfile(Path(checkpoint_dir) / CONFIG_FILE, folder / CONFIG_FILE)
        info = {"categories": [{"id": c.id, "name": c.name} for c in trained.categories],
                "step": trained.step, "moving_average": averaged}
        (folder / INFO_FILE).write_text(json.dumps(info, indent=1))
    return out


def read_export_info(directory: str | Path) -> dict:
    """``detsweep.json`` of an export: ``categories``, ``step``, ``moving_average``."""
    return json.loads((Path(directory) / INFO_FILE).read_text())


class DetectionModule(tf.Module):
    """The serving graph around a trained detector: :func:`~detsweep.data.processing.detect_pictures`."""

    def __init__(self, model, spec: InputSpec, category_ids: list[int]):
        super().__init__()
        self.model = model
        self.spec = spec
        self.category_ids = category_ids

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")])
    def serve(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        return detect_pictures(self.model, images, self.spec, self.category_ids)
