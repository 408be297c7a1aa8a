"""Detections on image files by an exported SavedModel or straight from a checkpoint, each
with its class name, and pictures of them.

Images are read as the pipeline reads them (grayscale and palette images become RGB, alpha
is dropped) and go to the model one at a time, at their own size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from detsweep.errors import DetsweepError
from detsweep.evaluation.pictures import image_picture

from .paths import check_exported, check_images
from .saved_model import SIGNATURE, read_export_info

# uint8 [1, height, width, 3] → the serving outputs (detection_boxes, …) as arrays
DetectFunction = Callable[[np.ndarray], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Predictor:
    """A model that detects, and the names of the classes it detects."""

    detect: DetectFunction
    names: dict[int, str]  # category id → name

    def predict(self, image: np.ndarray, min_score: float) -> list[dict]:
        """The detections of one uint8 ``[height, width, 3]`` image scoring at least ``min_score``;
        boxes are normalised ``ymin, xmin, ymax, xmax``."""
        out = self.detect(image[None])
        count = int(out["num_detections"][0])
        found = zip(out["detection_classes"][0, :count], out["detection_scores"][0, :count],
                    out["detection_boxes"][0, :count])
        return [{"class_id": int(c), "class_name": self.names.get(int(c), str(c)), "score": float(score),
                 "box": [float(v) for v in box]}
                for c, score, box in found if score >= min_score]


def saved_model_predictor(directory: str | Path) -> Predictor:
    directory = check_exported(directory)
    serve = tf.saved_model.load(str(directory)).signatures[SIGNATURE]

    def detect(images: np.ndarray) -> dict[str, np.ndarray]:
        return {key: value.numpy() for key, value in serve(images=tf.constant(images)).items()}

    return Predictor(detect, category_names(read_export_info(directory)["categories"]))


def checkpoint_predictor(directory: str | Path, use_average: bool = True) -> Predictor:
    from detsweep.checkpoints import read_meta

    from .detector import Detector

    detector = Detector.from_checkpoint(str(directory), use_average)
    return Predictor(detector.detect, category_names(read_meta(Path(directory))["categories"]))


def category_names(categories: list[dict]) -> dict[int, str]:
    return {category["id"]: category["name"] for category in categories}


def predict_files(predictor: Predictor, paths: Sequence[str | Path], min_score: float,
                  out_dir: str | Path | None = None) -> list[dict]:
    """``[{"path", "detections"}]`` per image; with ``out_dir``, also ``out_dir/<stem>.png``
    showing the detections."""
    check_images(paths, out_dir)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    results = []
    for path in paths:
        image = decode_image_file(path)
        detections = predictor.predict(image, min_score)
        if out_dir is not None:
            picture = picture_of(image, detections, f"{Path(path).name}: score >= {min_score}")
            (Path(out_dir) / f"{Path(path).stem}.png").write_bytes(picture)
        results.append({"path": str(path), "detections": detections})
    return results


def decode_image_file(path: str | Path) -> np.ndarray:
    try:
        # channels=3, as the pipeline decodes: grayscale becomes RGB, alpha is dropped.
        return tf.io.decode_image(tf.io.read_file(str(path)), channels=3, expand_animations=False).numpy()
    except tf.errors.OpError as error:
        raise DetsweepError(f"{path}: cannot read it as an image ({error.message.splitlines()[0]})") from None


def picture_of(image: np.ndarray, detections: list[dict], title: str) -> bytes:
    height, width = image.shape[:2]
    pixels = np.array([height, width, height, width], np.float32)
    boxes = [(np.asarray(d["box"]) * pixels, d["class_name"], d["score"]) for d in detections]
    return image_picture(image, boxes, title)
