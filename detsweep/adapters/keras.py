"""Keras's undocumented parts (Keras 3.15): loading a weights file while leaving some layers as
they are, which ``load_weights`` does for the objects given as ``objects_to_skip``, a keyword its
docs do not name (keras-hub's ``Task.load_task_weights`` uses it to leave out the backbone). A
skipped layer's own layers are skipped with it: the loader reaches them only through it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import keras

__all__ = ["load_weights_except"]


def load_weights_except(model: keras.Model, path: str | Path, kept: Iterable[keras.layers.Layer]) -> None:
    """Load ``path`` (a ``.weights.h5`` file) into ``model``, every layer but those in ``kept`` and
    the layers inside them, which keep the values they have."""
    keras.saving.load_weights(model, str(path), objects_to_skip=list(kept))
