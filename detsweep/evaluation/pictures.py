"""A picture of a model's detections on a few val images, each beside its ground truth."""

from __future__ import annotations

import io

import numpy as np

from detsweep.data import DetectionSet

MIN_SCORE = 0.3
# A report's pictures travel under these keys beside the metrics, as base64 PNG text (Ray
# Train keeps reports as JSON); whoever logs metrics takes them out first.
PICTURE_PREFIX = "_picture/"
PICTURE_KEY = PICTURE_PREFIX + "detections"  # at every evaluation
SCHEDULE_PICTURE_KEY = PICTURE_PREFIX + "learning_rate"  # once, with a run's first report


def without_pictures(metrics: dict) -> dict:
    return {key: value for key, value in metrics.items() if not key.startswith(PICTURE_PREFIX)}


def detections_picture(val_set: DetectionSet, detections: list[dict], count: int = 3, title: str = "") -> bytes:
    """PNG bytes: one row per image (the first ``count`` of the val set), ground truth on the
    left, detections scoring at least ``MIN_SCORE`` on the right, with class names and scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {category.id: category.name for category in val_set.categories}
    examples = val_set.examples[:count]
    figure, axes = plt.subplots(len(examples), 2, figsize=(7, 3.4 * len(examples)), squeeze=False,
                                layout="constrained")
    for row, example in zip(axes, examples):
        image = read_image(example)
        truth = [(box, val_set.categories[label].name, None) for box, label in zip(example.boxes, example.labels)]
        found = [((d["bbox"][1], d["bbox"][0], d["bbox"][1] + d["bbox"][3], d["bbox"][0] + d["bbox"][2]),
                  names.get(d["category_id"], str(d["category_id"])), d["score"])
                 for d in detections if d["image_id"] == example.image_id and d["score"] >= MIN_SCORE]
        draw(row[0], image, truth, "ground truth", "tab:green")
        draw(row[1], image, found, f"detections (score >= {MIN_SCORE})", "tab:red")
    if title:
        figure.suptitle(title)
    return png_of(figure)


def image_picture(image: np.ndarray, boxes: list[tuple], title: str = "") -> bytes:
    """PNG bytes of one image with ``boxes`` drawn on it: ``(box in pixels, name, score)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height, width = image.shape[:2]
    figure, axis = plt.subplots(figsize=(6, 6 * height / width), layout="constrained")
    draw(axis, image, boxes, title, "tab:red")
    return png_of(figure)


def png_of(figure) -> bytes:
    import matplotlib.pyplot as plt

    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=72)
    plt.close(figure)
    return out.getvalue()


def read_image(example) -> np.ndarray:
    from PIL import Image

    source = io.BytesIO(example.encoded) if example.encoded is not None else example.path
    with Image.open(source) as image:
        return np.asarray(image.convert("RGB"))


def draw(axis, image: np.ndarray, boxes, title: str, colour: str) -> None:
    from matplotlib.patches import Rectangle

    height, width = image.shape[:2]
    axis.imshow(image)
    axis.set_title(title, fontsize=9)
    axis.axis("off")
    for box, name, score in boxes:
        if not np.all(np.isfinite(box)):
            continue
        # An untrained model's boxes can lie far outside the image; text there overflows
        # the font rasteriser.
        ymin, xmin, ymax, xmax = np.clip(box, 0, [height, width, height, width])
        axis.add_patch(Rectangle((xmin, ymin), xmax - xmin, ymax - ymin, fill=False, edgecolor=colour, linewidth=1.5))
        label = name if score is None else f"{name} {score:.2f}"
        axis.text(xmin, ymin, label, fontsize=7, color="white", va="bottom",
                  bbox={"facecolor": colour, "alpha": 0.7, "pad": 1, "linewidth": 0})
