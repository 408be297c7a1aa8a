"""The trial configuration: one typed, frozen object per YAML file.

Every section is a pydantic model that rejects unknown keys. Values are checked
here, once; code that receives a :class:`TrialConfig` trusts it.

Names and defaults in ``optimizer`` follow the TF Object Detection API's
``optimizer.proto`` so that an OD API user's numbers mean the same thing here.
Where the OD API nests one message per optimizer and per schedule, detsweep keeps
one flat section with a ``type`` selector, so that a sweep can vary the type and
each number independently (see the README's mapping table).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

NonNegFloat = Annotated[float, Field(ge=0)]
Probability = Annotated[float, Field(ge=0, le=1)]
Fraction = Annotated[float, Field(gt=0, lt=1)]
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]


def invalid(field: str, found: Any, expected: str) -> PydanticCustomError:
    """An error about ``field`` of the model being validated, for cross-field checks.

    The loader turns it into ``path.to.field: found X, expected Y``.
    """
    return PydanticCustomError("detsweep", "{expected}", {"field": field, "found": found, "expected": expected})


def _aliases(table: dict[str, str]) -> BeforeValidator:
    return BeforeValidator(lambda value: table.get(value, value) if isinstance(value, str) else value)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- optimizer -----------------------------------------------------------------

ScheduleType = Literal["constant", "exponential_decay", "cosine", "manual_step"]
OptimizerType = Literal["sgd", "momentum", "adam", "adamw", "rms_prop"]

# The OD API's oneof names are accepted too, so its users can write what they know.
SCHEDULE_ALIASES = {
    "constant_learning_rate": "constant",
    "exponential_decay_learning_rate": "exponential_decay",
    "cosine_decay_learning_rate": "cosine",
    "cosine_decay": "cosine",
    "manual_step_learning_rate": "manual_step",
}
OPTIMIZER_ALIASES = {
    "momentum_optimizer": "momentum",
    "adam_optimizer": "adam",
    "rms_prop_optimizer": "rms_prop",
    "rmsprop": "rms_prop",
}
# The OD API's defaults for epsilon differ from Keras's (1e-7) and between optimizers.
DEFAULT_EPSILON = {"adam": 1e-8, "adamw": 1e-8, "rms_prop": 1.0}


class ManualStep(Section):
    step: PosInt
    learning_rate: NonNegFloat = 0.002


class LearningRateConfig(Section):
    """All four OD API schedules in one section; ``type`` picks the one that is used.

    Fields of the other schedules may be present (a sweep sets them) and are ignored.
    """

    type: Annotated[ScheduleType, _aliases(SCHEDULE_ALIASES)] = Field(
        "constant", description="the schedule: constant, exponential_decay, cosine or manual_step"
    )
    # constant_learning_rate
    learning_rate: NonNegFloat = 0.002
    # exponential_decay_learning_rate (initial_learning_rate is shared with manual_step)
    initial_learning_rate: NonNegFloat = 0.002
    decay_steps: PosInt = 4_000_000
    decay_factor: Annotated[float, Field(gt=0)] = 0.95
    staircase: bool = True
    burnin_learning_rate: NonNegFloat = 0.0
    burnin_steps: NonNegInt = 0
    min_learning_rate: NonNegFloat = 0.0
    # cosine_decay_learning_rate
    learning_rate_base: NonNegFloat = 0.002
    total_steps: NonNegInt = 4_000_000
    warmup_learning_rate: NonNegFloat = 0.0002
    warmup_steps: NonNegInt = 10_000
    hold_base_rate_steps: NonNegInt = 0
    # manual_step_learning_rate
    schedule: list[ManualStep] = Field(default_factory=list, description="a list of {step, learning_rate}")
    warmup: bool = False

    @model_validator(mode="before")
    @classmethod
    def _schedule_name_as_type(cls, data: Any) -> Any:
        # `schedule: cosine` reads naturally in a sweep; a list under `schedule` stays
        # the OD API's manual steps.
        if isinstance(data, dict) and isinstance(data.get("schedule"), str):
            data = dict(data)
            name = data.pop("schedule")
            if "type" in data and SCHEDULE_ALIASES.get(data["type"], data["type"]) != SCHEDULE_ALIASES.get(name, name):
                raise invalid("schedule", name, f"the same schedule as type ({data['type']!r}), or only one of the two")
            data["type"] = name
        return data

    @model_validator(mode="after")
    def _check_chosen_schedule(self) -> LearningRateConfig:
        if self.type == "cosine":
            self._check_cosine()
        elif self.type == "manual_step":
            self._check_manual_steps()
        return self

    def _check_cosine(self) -> None:
        default = "" if "warmup_steps" in self.model_fields_set else " (the OD API default)"
        # warm-up alone eating the run is the warm-up's fault, not the hold's
        if self.warmup_steps >= self.total_steps:
            raise invalid("warmup_steps", self.warmup_steps,
                          f"< total_steps ({self.total_steps}){default}, so that the decay has steps left")
        if self.warmup_steps + self.hold_base_rate_steps >= self.total_steps:
            raise invalid(
                "hold_base_rate_steps",
                self.hold_base_rate_steps,
                f"< total_steps - warmup_steps ({self.total_steps - self.warmup_steps}), so that the decay has steps left",
            )
        if self.warmup_steps > 0 and self.warmup_learning_rate > self.learning_rate_base:
            raise invalid(
                "warmup_learning_rate", self.warmup_learning_rate, f"<= learning_rate_base ({self.learning_rate_base})"
            )

    def _check_manual_steps(self) -> None:
        steps = [entry.step for entry in self.schedule]
        for i in range(1, len(steps)):
            if steps[i] <= steps[i - 1]:
                raise invalid(f"schedule.{i}.step", steps[i], f"> {steps[i - 1]} (steps must strictly increase)")


class OptimizerConfig(Section):
    type: Annotated[OptimizerType, _aliases(OPTIMIZER_ALIASES)] = Field(
        description="the optimizer: sgd, momentum, adam, adamw or rms_prop (the OD API has no default either)"
    )
    learning_rate: LearningRateConfig = LearningRateConfig()
    momentum_optimizer_value: Annotated[float, Field(ge=0, lt=1)] = 0.9
    decay: Fraction = Field(0.9, description="rms_prop's discounting factor (Keras rho)")
    epsilon: Annotated[float, Field(gt=0)] | None = Field(
        None, description="None means the OD API default: 1e-8 for adam and adamw, 1.0 for rms_prop"
    )
    weight_decay: NonNegFloat = Field(0.004, description="adamw's decoupled weight decay (the Keras default)")
    use_moving_average: bool = True
    moving_average_decay: Fraction = 0.9999
    moving_average_dynamic_decay: bool = Field(
        False, description="EfficientDet's warm-up: decay = min(decay, (1 + step) / (10 + step))"
    )

    @model_validator(mode="before")
    @classmethod
    def _epsilon_default_of_type(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("epsilon") is None:
            kind = OPTIMIZER_ALIASES.get(data.get("type"), data.get("type"))
            if kind in DEFAULT_EPSILON:
                data = {**data, "epsilon": DEFAULT_EPSILON[kind]}
        return data


# --- data, model, training, scaling, tracking ------------------------------------


class DatasetConfig(Section):
    format: Literal["coco", "voc", "tfrecord", "synthetic"] = "synthetic"
    annotations: str | None = Field(
        None, description="COCO: the instances JSON; VOC: the folder of XML files; tfrecord: the record file(s)"
    )
    images: str | None = Field(None, description="the image folder (COCO, VOC)")
    label_map: str | None = Field(None, description="an OD API label map .pbtxt (tfrecord, VOC)")
    num_images: PosInt = Field(64, description="synthetic only")
    image_size: PosInt = Field(128, description="synthetic only")
    classes: PosInt = Field(3, description="synthetic only")
    seed: int = 0
    skip_empty: bool = Field(False, description="drop images without boxes instead of training on them")
    subset: tuple[NonNegInt, NonNegInt] | None = Field(
        None, description="[start, stop): only these images, in the reader's order (file names for VOC)"
    )
    version: str | None = Field(
        None, description="set at launch for data in a bucket: its content's version (S3's ETags), the one every "
                          "node trains on; a node that finds another refuses")

    @model_validator(mode="after")
    def _check_paths_for_format(self) -> DatasetConfig:
        if self.subset and self.subset[0] >= self.subset[1]:
            raise invalid("subset", list(self.subset), "[start, stop] with start < stop")
        needed = {"coco": ("annotations", "images"), "voc": ("annotations",), "tfrecord": ("annotations",)}
        for field in needed.get(self.format, ()):
            if getattr(self, field) is None:
                raise invalid(field, None, f"a path (format {self.format} needs {' and '.join(needed[self.format])})")
        return self


class RangeSection(Section):
    """A section whose ``(low, high)`` field pairs in ``ranges`` must be ordered."""

    ranges: ClassVar[tuple[tuple[str, str], ...]] = ()

    @model_validator(mode="after")
    def _ordered(self) -> RangeSection:
        for low, high in self.ranges:
            if getattr(self, low) > getattr(self, high):
                raise invalid(low, getattr(self, low), f"<= {high} ({getattr(self, high)})")
        return self


# Augmentations: the OD API's preprocessing steps, by its names, with its preprocessor.proto's
# defaults. Each is off (None) unless set; a sweep may set any one field of a step.
PositiveFloat = Annotated[float, Field(gt=0)]
AreaShare = Annotated[float, Field(gt=0, le=1)]
PixelValue = Annotated[float, Field(ge=0, le=255)]


class ScaleCropConfig(RangeSection):
    """The OD API's ``random_scale_crop_and_pad_to_square`` (defaults as there)."""

    ranges = (("scale_min", "scale_max"),)
    scale_min: PositiveFloat = 0.1
    scale_max: PositiveFloat = 2.0


class RandomCropImageConfig(RangeSection):
    """The OD API's ``random_crop_image``: a window of the decoded image drawn by
    ``tf.image.sample_distorted_bounding_box`` (defaults as its preprocessor.proto)."""

    ranges = (("min_aspect_ratio", "max_aspect_ratio"), ("min_area", "max_area"))
    min_object_covered: Probability = Field(1.0, description="the window covers at least this share of one box")
    min_aspect_ratio: PositiveFloat = Field(0.75, description="the window's width / height, at least")
    max_aspect_ratio: PositiveFloat = 1.33
    min_area: AreaShare = Field(0.1, description="the window's share of the image's area, at least")
    max_area: AreaShare = 1.0
    overlap_thresh: Probability = Field(0.3, description="a box whose share inside the window is below this is "
                                                         "dropped (as are boxes wholly outside it)")
    clip_boxes: bool = Field(True, description="boxes are clipped to the window")
    random_coef: Probability = Field(0.0, description="probability of keeping the original image")


class BrightnessConfig(Section):
    """The OD API's ``random_adjust_brightness``: pixels / 255 plus a delta drawn from
    [-max_delta, max_delta], clipped to [0, 1]."""

    max_delta: Annotated[float, Field(ge=0, le=1)] = 0.2


class ContrastConfig(RangeSection):
    """The OD API's ``random_adjust_contrast``: ``tf.image.adjust_contrast`` by a factor drawn from
    [min_delta, max_delta]."""

    ranges = (("min_delta", "max_delta"),)
    min_delta: NonNegFloat = 0.8
    max_delta: NonNegFloat = 1.25


class HueConfig(Section):
    """The OD API's ``random_adjust_hue``: ``tf.image.adjust_hue`` by a delta drawn from
    [-max_delta, max_delta] (a share of the colour wheel)."""

    max_delta: Annotated[float, Field(ge=0, le=1)] = 0.02


class SaturationConfig(RangeSection):
    """The OD API's ``random_adjust_saturation``: ``tf.image.adjust_saturation`` by a factor drawn
    from [min_delta, max_delta]."""

    ranges = (("min_delta", "max_delta"),)
    min_delta: NonNegFloat = 0.8
    max_delta: NonNegFloat = 1.25


class SquareCropByScaleConfig(RangeSection):
    """The OD API's ``random_square_crop_by_scale``: a square of side scale x the longer side,
    around a centre at least a border from the edges; zeros where it leaves the image."""

    ranges = (("scale_min", "scale_max"),)
    max_border: PosInt = Field(128, description="the centre's distance from the edges in pixels, halved until "
                                                "it is at most half the side")
    scale_min: PositiveFloat = 0.6
    scale_max: PositiveFloat = 1.3
    num_scales: PosInt = Field(8, description="scales drawn from, evenly spaced from scale_min to scale_max")


class AbsolutePadConfig(Section):
    """The OD API's ``random_absolute_pad_image``: the image placed at random on a canvas larger by
    [0, max_height_padding) and [0, max_width_padding) pixels."""

    max_height_padding: PosInt = Field(1, description="unset in the OD API, which its builder reads as 1 "
                                                      "(no padding)")
    max_width_padding: PosInt = 1
    pad_color: tuple[PixelValue, PixelValue, PixelValue] | None = Field(
        None, description="RGB, 0..255; None: the image's mean colour (the OD API's default)")


# The steps on the decoded image, by their AugmentationConfig field, in their default order.
DecodedImageStep = Literal["random_crop_image", "random_adjust_brightness", "random_adjust_contrast",
                           "random_adjust_hue", "random_adjust_saturation", "random_square_crop_by_scale",
                           "random_absolute_pad_image", "random_horizontal_flip"]


class AugmentationConfig(Section):
    """The OD API's data_augmentation_options that detsweep has, each on the decoded image (before
    the resize) in the order ``order`` names them (an imported file's order), the others after
    them in this order: random_crop_image, the colour steps (brightness, contrast, hue,
    saturation), random_square_crop_by_scale, random_absolute_pad_image, random_horizontal_flip;
    then, on the resized image, random_scale_crop_and_pad_to_square."""

    random_horizontal_flip: Probability = Field(0.0, description="probability of a flip (the OD API's default is 0.5)")
    random_crop_image: RandomCropImageConfig | None = None
    random_adjust_brightness: BrightnessConfig | None = None
    random_adjust_contrast: ContrastConfig | None = None
    random_adjust_hue: HueConfig | None = None
    random_adjust_saturation: SaturationConfig | None = None
    random_square_crop_by_scale: SquareCropByScaleConfig | None = None
    random_absolute_pad_image: AbsolutePadConfig | None = None
    random_scale_crop_and_pad_to_square: ScaleCropConfig | None = Field(
        None, description="scale jitter: zoom by a random factor, then crop or pad back to the square"
    )
    order: tuple[DecodedImageStep, ...] = Field(
        (), description="the steps above on the decoded image in the order of an OD API file's "
                        "data_augmentation_options; steps set but not named follow in the default order")

    @model_validator(mode="after")
    def _each_step_once(self) -> AugmentationConfig:
        repeated = sorted({step for step in self.order if self.order.count(step) > 1})
        if repeated:
            raise invalid("order", list(self.order), f"each step at most once ({repeated[0]} is there twice)")
        return self


class DataConfig(Section):
    train: DatasetConfig = DatasetConfig()
    val: DatasetConfig | None = None
    augmentation: AugmentationConfig = AugmentationConfig()
    max_boxes: PosInt | None = Field(
        None, description="training keeps at most this many boxes of an image, the first ones (the OD API's "
                          "max_number_of_boxes, 100 there); None: the most any training image has. What a value "
                          "cuts is counted and said when training starts")
    shuffle_buffer_size: PosInt = Field(
        2048, description="training shuffles each epoch in a buffer of this many images (the OD API's "
                          "shuffle_buffer_size); fixed, so a resumed run's batches are an unbroken run's on any node")


BackboneName = Literal["resnet_tiny", "resnet18", "resnet50", "resnet101", "resnet152"]
PosFloat = Annotated[float, Field(gt=0)]


class ModelConfig(Section):
    """keras-hub's RetinaNet, sized and trained by the OD API's names where it has them (the
    README's mapping table lists each): the OD API's SSD with an FPN and a weight-shared box
    predictor is this network."""

    # What the network is: its layers' shapes, and what its outputs mean (the input's size and
    # resizing, the anchors each output is for). A checkpoint fits only a network alike.
    ARCHITECTURE: ClassVar[tuple[str, ...]] = (
        "name", "backbone", "weights", "image_size", "image_resizer", "num_classes", "min_level", "max_level",
        "anchor_size", "scales_per_octave", "aspect_ratios", "head_conv_layers")

    name: Literal["retinanet"] = "retinanet"
    backbone: BackboneName = Field("resnet_tiny", description="a built-in encoder (random weights)")
    weights: str = Field("none", description="'none', or a keras-hub preset: an image encoder's replaces "
                                             "`backbone`; a whole RetinaNet's is the detector, its architecture wins")
    image_size: PosInt = Field(128, description="the model's input is this square")
    image_resizer: Literal["keep_aspect_ratio", "fixed_shape"] = Field(
        "keep_aspect_ratio", description="keep_aspect_ratio: the longer side to image_size, padded to the square "
        "(the OD API's keep_aspect_ratio_resizer with pad_to_max_dimension); fixed_shape: stretched to the square "
        "(its fixed_shape_resizer)")
    image_mean: tuple[float, float, float] | None = Field(
        None, description="the input is (pixel - image_mean) / image_std, per channel in 0..255; None: ImageNet's "
                          "statistics, what keras-hub's encoder presets expect (a detector preset sets its own)")
    image_std: tuple[PosFloat, PosFloat, PosFloat] | None = None
    num_classes: PosInt | None = Field(None, description="None: the number of categories in the training data")
    min_level: Annotated[int, Field(ge=3, le=5)] = 3
    max_level: Annotated[int, Field(ge=3, le=7)] = 7
    anchor_size: PosFloat = Field(4.0, description="anchor side in units of its level's stride (the OD API's "
                                                   "anchor_scale)")
    scales_per_octave: Annotated[int, Field(ge=1, le=8)] = Field(3, description="anchor sizes per level, "
                                                                                "2 ** (i / scales_per_octave) apart")
    aspect_ratios: tuple[PosFloat, ...] = Field((2.0, 1.0, 0.5), min_length=1, description="anchor width / height "
                                                                                        "(the OD API's ratio)")
    head_conv_layers: Annotated[int, Field(ge=0, le=4)] = Field(4, description="conv layers before each head (the "
                                                                               "OD API's num_layers_before_predictor)")
    head_kernel_stddev: PosFloat | None = Field(
        None, description="the heads' kernels start from a normal of this stddev (the OD API's box predictor "
                          "random_normal_initializer; 0.01 in its RetinaNets); None: keras-hub's (0.05)")
    class_prediction_bias_init: float | None = Field(
        None, description="the classification head's starting bias (the OD API's; -4.6 is a prior of 0.01); "
                          "None: keras-hub's zeros")
    use_sync_bn: bool = Field(False, description="batch norm's batch statistics over the global batch, every "
                                                 "replica's images (Model Garden's use_sync_bn)")
    matched_threshold: Probability = Field(0.5, description="argmax_matcher's: an anchor with IoU at or above it "
                                                            "learns the box")
    unmatched_threshold: Probability = Field(0.4, description="argmax_matcher's: below it, background; between "
                                                              "the two, ignored")
    force_match_for_each_row: bool = Field(False, description="argmax_matcher's: every box keeps its best anchor")
    box_coder_scales: tuple[PosFloat, PosFloat, PosFloat, PosFloat] = Field(
        (1.0, 1.0, 1.0, 1.0), description="faster_rcnn_box_coder's y_scale, x_scale, height_scale, width_scale: "
                                          "box targets are multiplied by them")
    focal_alpha: Probability | None = Field(None, description="weighted_sigmoid_focal's alpha: positives weigh "
                                                              "alpha, negatives 1 - alpha; None: no weighting")
    focal_gamma: NonNegFloat = Field(2.0, description="weighted_sigmoid_focal's gamma")
    classification_loss_over_classes: Literal["mean", "sum"] = Field(
        "mean", description="mean: keras-hub's focal loss, averaged over the classes; sum: the OD API's")
    smooth_l1_delta: PosFloat = Field(1.0, description="weighted_smooth_l1's delta (Keras's Huber)")
    normalize_loc_loss_by_codesize: bool = Field(
        True, description="the box loss divided by 4, its code size (true: keras-hub's Huber, a mean over the "
                          "code; the OD API's default is false)")
    l2_regularization: NonNegFloat = Field(
        0.0, description="the OD API's l2_regularizer weight: every convolution kernel adds weight * 0.5 * "
                         "sum(kernel ** 2) to the loss, as the OD API's Keras models apply it")
    classification_weight: NonNegFloat = Field(1.0, description="the OD API's loss.classification_weight")
    localization_weight: NonNegFloat = Field(1.0, description="the OD API's loss.localization_weight")
    score_threshold: Probability = Field(0.05, description="detections below are dropped (COCO convention)")
    nms_iou_threshold: Probability = 0.5
    max_detections: PosInt = Field(100, description="detections kept per image (the OD API's max_total_detections)")
    use_class_agnostic_nms: bool = Field(
        True, description="true: one suppression over every class, each box with its best class (keras-hub's); "
                          "false: a suppression per class, a box kept under each class it scores for (the OD "
                          "API's default)")
    max_detections_per_class: PosInt = Field(100, description="with use_class_agnostic_nms false: detections "
                                                              "kept per class before the best max_detections")

    @model_validator(mode="after")
    def _check_pyramid(self) -> ModelConfig:
        if self.max_level < self.min_level:
            raise invalid("max_level", self.max_level, f">= min_level ({self.min_level})")
        stride = 2**self.max_level
        if self.image_size % stride:
            raise invalid("image_size", self.image_size, f"a multiple of {stride} (2 ** max_level)")
        if (self.image_mean is None) != (self.image_std is None):
            raise invalid("image_std", self.image_std, f"set together with image_mean ({self.image_mean})")
        if self.unmatched_threshold > self.matched_threshold:
            raise invalid("unmatched_threshold", self.unmatched_threshold,
                          f"<= matched_threshold ({self.matched_threshold})")
        return self

    def architecture_key(self, num_classes: int) -> str:
        """The same for two configs exactly when their networks are alike (:attr:`ARCHITECTURE`):
        a sweep's trials find their architecture's serving cost by it."""
        fields = {name: getattr(self, name) for name in self.ARCHITECTURE} | {"num_classes": num_classes}
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=list).encode()).hexdigest()[:16]


class FineTuneConfig(Section):
    """Start from another training's checkpoint, as the OD API's ``fine_tune_checkpoint`` does:
    every weight whose name and shape match is restored, the rest starts fresh."""

    checkpoint: str = Field(description="a detsweep checkpoint folder, or an MLflow checkpoint models:/<model_id> (or an artifact URI runs:/<run>/<path>)")
    from_moving_average: bool = Field(False, description="start from the checkpoint's averaged weights")
    keep_optimizer_state: bool = Field(
        False, description="keep the optimizer's slots and step (training goes on to num_steps); "
                           "false: a fresh optimizer and schedule from step 0")


class TrainConfig(Section):
    batch_size: PosInt = Field(8, description="the global batch, split evenly across workers (as in the OD API)")
    num_steps: PosInt = 1000
    steps_per_loop: PosInt = 10
    eval_every: NonNegInt = Field(0, description="0: evaluate only at the end")
    checkpoint_every: NonNegInt = Field(0, description="0: checkpoint only at the end")
    evaluation: Literal["inline", "async"] = Field(
        "inline", description="inline: rank 0 evaluates between loops while the other workers wait; "
                              "async: each evaluation step saves a checkpoint that a Ray task evaluates "
                              "(one worker's resources) while training goes on")
    eval_batch_size: PosInt = Field(8, description="images each device runs through the model at once when "
                                                   "evaluating (the OD API's eval_config.batch_size; inline, "
                                                   "each worker takes a share of the val set)")
    mixed_precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    gradient_clipping_by_norm: NonNegFloat = Field(0.0, description="0: no clipping (as in the OD API)")
    jit_compile: bool = Field(False, description="XLA: each replica's forward and backward pass compiled "
                                                 "(the gradients' all-reduce and the optimizer's update are not)")
    seed: int = 0
    fine_tune: FineTuneConfig | None = None

    @model_validator(mode="after")
    def _check_loop_boundaries(self) -> TrainConfig:
        # Python only runs between loops, so evaluation and checkpoints happen there.
        for field in ("eval_every", "checkpoint_every"):
            value = getattr(self, field)
            if value % self.steps_per_loop:
                raise invalid(field, value, f"a multiple of train.steps_per_loop ({self.steps_per_loop})")
        return self


class ScalingConfig(Section):
    num_workers: PosInt = 1
    use_gpu: bool = False
    cpus_per_worker: Annotated[float, Field(gt=0)] = 1.0
    gpus_per_worker: NonNegFloat = Field(1.0, description="used only with use_gpu")
    use_tpu: bool = False
    topology: str | None = Field(None, description="TPU slice topology, e.g. 2x2x2 (use_tpu)")
    accelerator_type: str | None = Field(None, description="e.g. A100 or TPU-V4; None: any")
    max_failures: NonNegInt = Field(2, description="worker-group restarts from the last checkpoint before failing, "
                                     "when workers fail (a diverged training is not restarted)")

    @model_validator(mode="after")
    def _one_accelerator(self) -> ScalingConfig:
        if self.use_gpu and self.use_tpu:
            raise invalid("use_tpu", True, "false when use_gpu is true (one accelerator kind per trial)")
        if self.use_gpu and self.gpus_per_worker > 1 and not self.gpus_per_worker.is_integer():
            raise invalid("gpus_per_worker", self.gpus_per_worker, "a fraction of one GPU, or whole GPUs")
        return self

    @property
    def replicas(self) -> int:
        """Model replicas in step: each worker trains one per GPU it holds (one on its CPU, or on
        a shared fraction of a GPU)."""
        per_worker = int(self.gpus_per_worker) if self.use_gpu and self.gpus_per_worker >= 1 else 1
        return self.num_workers * per_worker


class TrackingConfig(Section):
    uri: str | None = Field(None, description="None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    experiment: str | None = Field(None, description="None: the sweep's name")

    @model_validator(mode="after")
    def _known_backend(self) -> TrackingConfig:
        if self.uri is not None and not self.uri.startswith(("http://", "https://", "sqlite:///")):
            raise invalid("uri", self.uri, "an http(s):// MLflow server or a sqlite:/// file")
        return self


class TrialConfig(Section):
    """Everything one training run needs."""

    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    optimizer: OptimizerConfig = Field(description="an optimizer section with a type (the OD API requires one)")
    scaling: ScalingConfig = ScalingConfig()
    tracking: TrackingConfig = TrackingConfig()

    @model_validator(mode="after")
    def _batch_splits_across_replicas(self) -> TrialConfig:
        scaling = self.scaling
        if self.train.batch_size % scaling.replicas:
            across = (f"scaling.num_workers ({scaling.num_workers})" if scaling.replicas == scaling.num_workers else
                      f"the replicas, {scaling.num_workers} worker(s) x {scaling.replicas // scaling.num_workers} GPUs each")
            raise invalid("train.batch_size", self.train.batch_size, f"a multiple of {across}")
        return self

    @model_validator(mode="after")
    def _jitter_on_a_picture_of_its_aspect(self) -> TrialConfig:
        # The jitter zooms the resized image; stretched, it would zoom a distorted square (the
        # OD API's zooms the picture, its aspect kept).
        if self.model.image_resizer == "fixed_shape" and self.data.augmentation.random_scale_crop_and_pad_to_square:
            jitter = self.data.augmentation.random_scale_crop_and_pad_to_square.model_dump()
            raise invalid("data.augmentation.random_scale_crop_and_pad_to_square", jitter,
                          "none with model.image_resizer: fixed_shape (it would zoom the stretched square)")
        return self

    @model_validator(mode="after")
    def _xla_where_it_compiles(self) -> TrialConfig:
        # The synchronized batch norm all-reduces inside the forward pass, which XLA cannot hold.
        if self.train.jit_compile and self.model.use_sync_bn:
            raise invalid("train.jit_compile", True, "false with model.use_sync_bn: true (its all-reduce runs "
                          "inside the forward pass, which XLA cannot compile)")
        return self
