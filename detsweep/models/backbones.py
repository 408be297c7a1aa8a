"""Image encoders for the detectors: keras-hub backbones, by name or by preset.

Built-in names make the architecture here, with random weights, so they work offline
(our CI cannot download presets). ``model.weights`` names a keras-hub preset instead,
loaded by keras-hub's own ``from_preset`` (architecture and pretrained weights).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import keras_hub


def _resnet(filters: list[int], blocks: list[int], block_type: str, stem_kernel: int = 7) -> Callable[[], keras.Model]:
    def build() -> keras.Model:
        return keras_hub.models.ResNetBackbone(
            input_conv_filters=[64],
            input_conv_kernel_sizes=[stem_kernel],
            stackwise_num_filters=filters,
            stackwise_num_blocks=blocks,
            stackwise_num_strides=[1, 2, 2, 2],
            block_type=block_type,
        )

    return build


BACKBONES: dict[str, Callable[[], keras.Model]] = {
    # A CPU-sized encoder for the quickstart and tests: one basic block per stage.
    # (keras-hub's ResNet needs 64 filters in the stem and the first stage.)
    "resnet_tiny": _resnet([64, 64, 96, 128], [1, 1, 1, 1], "basic_block", stem_kernel=3),
    "resnet18": _resnet([64, 128, 256, 512], [2, 2, 2, 2], "basic_block"),
    "resnet50": _resnet([64, 128, 256, 512], [3, 4, 6, 3], "bottleneck_block"),
    "resnet101": _resnet([64, 128, 256, 512], [3, 4, 23, 3], "bottleneck_block"),
    "resnet152": _resnet([64, 128, 256, 512], [3, 8, 36, 3], "bottleneck_block"),
}


def build_backbone(name: str, weights: str = "none") -> keras.Model:
    """The image encoder: a keras-hub preset when ``weights`` names one, else the built-in ``name``."""
    if weights != "none":
        return keras_hub.models.Backbone.from_preset(weights)
    return BACKBONES[name]()
