"""Import a TF Object Detection API ``pipeline.config`` (or a bare ``optimizer { … }`` block).

The text is parsed by protobuf's own ``text_format`` against a descriptor of the OD API
fields detsweep uses, built below with the OD API's field names, numbers and proto2
defaults (so an unset field reads as the OD API's default, e.g. ``decay_steps``
4000000). Fields outside that subset, such as the body of ``model { ssd { … } }``, are
not an error; but every field the file sets is accounted for (issue #39): carried over
into the detsweep config, or named in :attr:`Imported.not_carried` or
:attr:`Imported.notes` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

from google.protobuf import message, text_format
from google.protobuf.descriptor import FieldDescriptor

from detsweep.errors import DetsweepError
from detsweep.textproto import WrittenField, as_written, build_message_classes, written_fields

from .odapi_ssd import carry_ssd
from .schema import AugmentationConfig, DecodedImageStep

_PACKAGE = "detsweep.odapi"
_RESIZE_METHOD = "enum:BILINEAR,NEAREST_NEIGHBOR,BICUBIC,AREA"

# (field name, number, type, default) per message, as detsweep.textproto reads them; a
# type that is not a scalar names a message below; `repeated` marks repeated fields. Taken
# from the OD API's optimizer.proto, train.proto, pipeline.proto, input_reader.proto,
# preprocessor.proto.
_MESSAGES: dict[str, list[tuple]] = {
    "TrainEvalPipelineConfig": [
        ("model", 1, "DetectionModel"),
        ("train_config", 2, "TrainConfig"),
        ("train_input_reader", 3, "InputReader"),
        ("eval_config", 4, "EvalConfig"),
        ("eval_input_reader", 5, "InputReader", None, "repeated"),
        # Not in the OD API: lets a file hold just an `optimizer { … }` block.
        ("optimizer", 100, "Optimizer"),
    ],
    "DetectionModel": [("ssd", 2, "Ssd"), ("faster_rcnn", 1, "ArchitectureWithClasses"),
                       ("center_net", 6, "ArchitectureWithClasses")],
    "ArchitectureWithClasses": [("num_classes", 1, "int32")],
    # ssd.proto and the messages it uses, for the SSD that is RetinaNet (FPN, weight-shared box predictor)
    "Ssd": [
        ("num_classes", 1, "int32"),
        ("image_resizer", 2, "ImageResizer"),
        ("feature_extractor", 3, "SsdFeatureExtractor"),
        ("box_coder", 4, "BoxCoder"),
        ("matcher", 5, "Matcher"),
        ("similarity_calculator", 6, "RegionSimilarityCalculator"),
        ("box_predictor", 7, "BoxPredictor"),
        ("anchor_generator", 8, "AnchorGenerator"),
        ("post_processing", 9, "PostProcessing"),
        ("normalize_loss_by_num_matches", 10, "bool", True),
        ("loss", 11, "Loss"),
        ("encode_background_as_zeros", 12, "bool", False),
        ("negative_class_weight", 13, "float", 1.0),
        ("normalize_loc_loss_by_codesize", 14, "bool", False),
        ("inplace_batchnorm_update", 15, "bool", False),
        ("freeze_batchnorm", 16, "bool", False),
        ("add_background_class", 21, "bool", True),
    ],
    "ImageResizer": [("keep_aspect_ratio_resizer", 1, "KeepAspectRatioResizer"),
                     ("fixed_shape_resizer", 2, "FixedShapeResizer")],
    "KeepAspectRatioResizer": [("min_dimension", 1, "int32", 600), ("max_dimension", 2, "int32", 1024),
                               ("resize_method", 3, _RESIZE_METHOD, "BILINEAR"),
                               ("pad_to_max_dimension", 4, "bool", False)],
    "FixedShapeResizer": [("height", 1, "int32", 300), ("width", 2, "int32", 300),
                          ("resize_method", 3, _RESIZE_METHOD, "BILINEAR")],
    "SsdFeatureExtractor": [
        ("type", 1, "string"),
        ("depth_multiplier", 2, "float", 1.0),
        ("min_depth", 3, "int32", 16),
        ("conv_hyperparams", 4, "Hyperparams"),
        ("pad_to_multiple", 5, "int32", 1),
        ("use_explicit_padding", 7, "bool", False),
        ("use_depthwise", 8, "bool", False),
        ("override_base_feature_extractor_hyperparams", 9, "bool", False),
        ("fpn", 10, "FeaturePyramidNetworks"),
    ],
    "FeaturePyramidNetworks": [("min_level", 1, "int32", 3), ("max_level", 2, "int32", 7),
                               ("additional_layer_depth", 3, "int32", 256)],
    "Hyperparams": [("regularizer", 2, "Regularizer"), ("initializer", 3, "Initializer"),
                    ("activation", 4, "enum:NONE,RELU,RELU_6,SWISH", "RELU"), ("batch_norm", 5, "BatchNorm")],
    "BatchNorm": [("decay", 1, "float", 0.999), ("center", 2, "bool", True), ("scale", 3, "bool", False),
                  ("epsilon", 4, "float", 0.001), ("train", 5, "bool", True)],
    "Initializer": [("random_normal_initializer", 3, "RandomNormalInitializer")],
    "RandomNormalInitializer": [("mean", 1, "float", 0.0), ("stddev", 2, "float", 1.0)],
    "Regularizer": [("l2_regularizer", 2, "L2Regularizer")],
    "L2Regularizer": [("weight", 1, "float", 1.0)],
    "BoxCoder": [("faster_rcnn_box_coder", 1, "FasterRcnnBoxCoder")],
    "FasterRcnnBoxCoder": [("y_scale", 1, "float", 10.0), ("x_scale", 2, "float", 10.0),
                           ("height_scale", 3, "float", 5.0), ("width_scale", 4, "float", 5.0)],
    "Matcher": [("argmax_matcher", 1, "ArgMaxMatcher")],
    "ArgMaxMatcher": [("matched_threshold", 1, "float", 0.5), ("unmatched_threshold", 2, "float", 0.5),
                      ("ignore_thresholds", 3, "bool", False), ("negatives_lower_than_unmatched", 4, "bool", True),
                      ("force_match_for_each_row", 5, "bool", False), ("use_matmul_gather", 6, "bool", False)],
    "RegionSimilarityCalculator": [("iou_similarity", 2, "Empty")],
    "BoxPredictor": [("weight_shared_convolutional_box_predictor", 4, "WeightSharedConvolutionalBoxPredictor")],
    "WeightSharedConvolutionalBoxPredictor": [
        ("conv_hyperparams", 1, "Hyperparams"),
        ("depth", 2, "int32", 0),
        ("num_layers_before_predictor", 4, "int32", 0),
        ("kernel_size", 7, "int32", 3),
        ("box_code_size", 8, "int32", 4),
        ("class_prediction_bias_init", 10, "float", 0.0),
        ("use_dropout", 11, "bool", False),
    ],
    "AnchorGenerator": [("multiscale_anchor_generator", 3, "MultiscaleAnchorGenerator")],
    "MultiscaleAnchorGenerator": [("min_level", 1, "int32", 3), ("max_level", 2, "int32", 7),
                                  ("anchor_scale", 3, "float", 4.0), ("aspect_ratios", 4, "float", None, "repeated"),
                                  ("scales_per_octave", 5, "int32", 2), ("normalize_coordinates", 6, "bool", True)],
    "PostProcessing": [("batch_non_max_suppression", 1, "BatchNonMaxSuppression"),
                       ("score_converter", 2, "enum:IDENTITY,SIGMOID,SOFTMAX", "IDENTITY")],
    "BatchNonMaxSuppression": [("score_threshold", 1, "float", 0.0), ("iou_threshold", 2, "float", 0.6),
                               ("max_detections_per_class", 3, "int32", 100),
                               ("max_total_detections", 5, "int32", 100),
                               ("use_class_agnostic_nms", 7, "bool", False)],
    "Loss": [("localization_loss", 1, "LocalizationLoss"), ("classification_loss", 2, "ClassificationLoss"),
             ("classification_weight", 4, "float", 1.0), ("localization_weight", 5, "float", 1.0)],
    "LocalizationLoss": [("weighted_smooth_l1", 2, "WeightedSmoothL1")],
    "WeightedSmoothL1": [("delta", 2, "float", 1.0)],
    "ClassificationLoss": [("weighted_sigmoid", 1, "Empty"), ("weighted_sigmoid_focal", 4, "SigmoidFocal")],
    "SigmoidFocal": [("gamma", 2, "float", 2.0), ("alpha", 3, "float")],
    "TrainConfig": [
        ("data_augmentation_options", 2, "PreprocessingStep", None, "repeated"),
        ("optimizer", 4, "Optimizer"),
        ("gradient_clipping_by_norm", 5, "float", 0.0),
        ("fine_tune_checkpoint", 7, "string"),
        ("fine_tune_checkpoint_type", 22, "string"),
        ("from_detection_checkpoint", 8, "bool", False),
        ("num_steps", 9, "uint32", 0),
        ("batch_size", 1, "uint32", 32),
        ("use_bfloat16", 26, "bool", False),
        ("sync_replicas", 11, "bool", False),
    ],
    "EvalConfig": [("num_examples", 2, "uint32", 5000), ("batch_size", 25, "uint32", 1)],
    "InputReader": [
        ("label_map_path", 1, "string"),
        ("shuffle", 2, "bool", True),
        ("shuffle_buffer_size", 11, "uint32", 2048),
        ("max_number_of_boxes", 21, "int32", 100),
        ("tf_record_input_reader", 8, "TFRecordInputReader"),
    ],
    "TFRecordInputReader": [("input_path", 1, "string", None, "repeated")],
    "PreprocessingStep": [
        ("normalize_image", 1, "Empty"),
        ("random_horizontal_flip", 2, "RandomHorizontalFlip"),
        ("random_pixel_value_scale", 3, "Empty"),
        ("random_image_scale", 4, "Empty"),
        ("random_rgb_to_gray", 5, "Empty"),
        ("random_adjust_brightness", 6, "RandomAdjustBrightness"),
        ("random_adjust_contrast", 7, "RandomAdjustContrast"),
        ("random_adjust_hue", 8, "RandomAdjustHue"),
        ("random_adjust_saturation", 9, "RandomAdjustSaturation"),
        ("random_distort_color", 10, "Empty"),
        ("random_jitter_boxes", 11, "Empty"),
        ("random_crop_image", 12, "RandomCropImage"),
        ("random_pad_image", 13, "Empty"),
        ("random_crop_pad_image", 14, "Empty"),
        ("random_crop_to_aspect_ratio", 15, "Empty"),
        ("random_black_patches", 16, "Empty"),
        ("random_resize_method", 17, "Empty"),
        ("scale_boxes_to_pixel_coordinates", 18, "Empty"),
        ("resize_image", 19, "Empty"),
        ("subtract_channel_mean", 20, "Empty"),
        ("ssd_random_crop", 21, "Empty"),
        ("ssd_random_crop_pad", 22, "Empty"),
        ("ssd_random_crop_fixed_aspect_ratio", 23, "Empty"),
        ("ssd_random_crop_pad_fixed_aspect_ratio", 24, "Empty"),
        ("random_vertical_flip", 25, "Empty"),
        ("random_rotation90", 26, "Empty"),
        ("rgb_to_gray", 27, "Empty"),
        ("convert_class_logits_to_softmax", 28, "Empty"),
        ("random_absolute_pad_image", 29, "RandomAbsolutePadImage"),
        ("random_self_concat_image", 30, "Empty"),
        ("autoaugment_image", 31, "Empty"),
        ("drop_label_probabilistically", 32, "Empty"),
        ("remap_labels", 33, "Empty"),
        ("random_jpeg_quality", 34, "Empty"),
        ("random_downscale_to_target_pixels", 35, "Empty"),
        ("random_patch_gaussian", 36, "Empty"),
        ("random_square_crop_by_scale", 37, "RandomSquareCropByScale"),
        ("random_scale_crop_and_pad_to_square", 38, "RandomScaleCrop"),
        ("adjust_gamma", 39, "Empty"),
    ],
    "RandomHorizontalFlip": [("keypoint_flip_permutation", 1, "int32", None, "repeated"),
                             ("probability", 2, "float", 0.5)],
    "RandomAdjustBrightness": [("max_delta", 1, "float", 0.2)],
    "RandomAdjustContrast": [("min_delta", 1, "float", 0.8), ("max_delta", 2, "float", 1.25)],
    "RandomAdjustHue": [("max_delta", 1, "float", 0.02)],
    "RandomAdjustSaturation": [("min_delta", 1, "float", 0.8), ("max_delta", 2, "float", 1.25)],
    "RandomCropImage": [
        ("min_object_covered", 1, "float", 1.0),
        ("min_aspect_ratio", 2, "float", 0.75),
        ("max_aspect_ratio", 3, "float", 1.33),
        ("min_area", 4, "float", 0.1),
        ("max_area", 5, "float", 1.0),
        ("overlap_thresh", 6, "float", 0.3),
        ("random_coef", 7, "float", 0.0),
        ("clip_boxes", 8, "bool", True),
    ],
    # No defaults: the OD API's builder reads an unset (0) padding as 1, an unset colour as the mean.
    "RandomAbsolutePadImage": [("max_height_padding", 1, "int32"), ("max_width_padding", 2, "int32"),
                               ("pad_color", 3, "float", None, "repeated")],
    "RandomSquareCropByScale": [("max_border", 1, "int32", 128), ("scale_min", 2, "float", 0.6),
                                ("scale_max", 3, "float", 1.3), ("num_scales", 4, "int32", 8)],
    "RandomScaleCrop": [("output_size", 1, "int32", 512), ("scale_min", 2, "float", 0.1), ("scale_max", 3, "float", 2.0)],
    "Empty": [],
    "Optimizer": [
        ("rms_prop_optimizer", 1, "RMSPropOptimizer"),
        ("momentum_optimizer", 2, "MomentumOptimizer"),
        ("adam_optimizer", 3, "AdamOptimizer"),
        ("use_moving_average", 4, "bool", True),
        ("moving_average_decay", 5, "float", 0.9999),
    ],
    "RMSPropOptimizer": [
        ("learning_rate", 1, "LearningRate"),
        ("momentum_optimizer_value", 2, "float", 0.9),
        ("decay", 3, "float", 0.9),
        ("epsilon", 4, "float", 1.0),
    ],
    "MomentumOptimizer": [("learning_rate", 1, "LearningRate"), ("momentum_optimizer_value", 2, "float", 0.9)],
    "AdamOptimizer": [("learning_rate", 1, "LearningRate"), ("epsilon", 2, "float", 1e-8)],
    "LearningRate": [
        ("constant_learning_rate", 1, "ConstantLearningRate"),
        ("exponential_decay_learning_rate", 2, "ExponentialDecayLearningRate"),
        ("manual_step_learning_rate", 3, "ManualStepLearningRate"),
        ("cosine_decay_learning_rate", 4, "CosineDecayLearningRate"),
    ],
    "ConstantLearningRate": [("learning_rate", 1, "float", 0.002)],
    "ExponentialDecayLearningRate": [
        ("initial_learning_rate", 1, "float", 0.002),
        ("decay_steps", 2, "uint32", 4000000),
        ("decay_factor", 3, "float", 0.95),
        ("staircase", 4, "bool", True),
        ("burnin_learning_rate", 5, "float", 0.0),
        ("burnin_steps", 6, "uint32", 0),
        ("min_learning_rate", 7, "float", 0.0),
    ],
    "ManualStepLearningRate": [
        ("initial_learning_rate", 1, "float", 0.002),
        ("schedule", 2, "ManualStep", None, "repeated"),
        ("warmup", 3, "bool", False),
    ],
    "ManualStep": [("step", 1, "uint32"), ("learning_rate", 2, "float", 0.002)],
    "CosineDecayLearningRate": [
        ("learning_rate_base", 1, "float", 0.002),
        ("total_steps", 2, "uint32", 4000000),
        ("warmup_learning_rate", 3, "float", 0.0002),
        ("warmup_steps", 4, "uint32", 10000),
        ("hold_base_rate_steps", 5, "uint32", 0),
    ],
}
# Oneofs whose members are mutually exclusive in the OD API.
_ONEOFS = {
    "Optimizer": ("optimizer", ["rms_prop_optimizer", "momentum_optimizer", "adam_optimizer"]),
    "LearningRate": ("learning_rate", [name for name, *_ in _MESSAGES["LearningRate"]]),
    "DetectionModel": ("model", ["ssd", "faster_rcnn", "center_net"]),
    "ImageResizer": ("image_resizer_oneof", ["keep_aspect_ratio_resizer", "fixed_shape_resizer"]),
}


_CLASSES = build_message_classes("detsweep_odapi_subset.proto", _PACKAGE, _MESSAGES, _ONEOFS)

_AUGMENTATION_OPTIONS = "train_config.data_augmentation_options"
_DECODED_IMAGE_STEPS: tuple[str, ...] = get_args(DecodedImageStep)  # in detsweep's default order
# Why the subset's fields that no converter below carries over are left out, by plain path.
_WHY_LEFT_OUT = {
    "train_config.fine_tune_checkpoint_type": "goes with fine_tune_checkpoint, whose note names the preset to use",
    "train_config.from_detection_checkpoint": "goes with fine_tune_checkpoint, whose note names the preset to use",
    f"{_AUGMENTATION_OPTIONS}.random_scale_crop_and_pad_to_square.output_size":
        "detsweep crops and pads to model.image_size",
    f"{_AUGMENTATION_OPTIONS}.random_horizontal_flip.keypoint_flip_permutation": "detsweep has no keypoints",
    "eval_config.num_examples": "detsweep evaluates every image of data.val",
    "train_input_reader.shuffle": "detsweep always shuffles the training data",
    "eval_input_reader.shuffle": "detsweep reads data.val in order",
    "eval_input_reader.shuffle_buffer_size": "detsweep reads data.val in order",
    "eval_input_reader.max_number_of_boxes": "detsweep's evaluation keeps every box of data.val",
}
# Whether detsweep shuffles each split, to carry over a `shuffle` that agrees.
_SHUFFLES = {"train": True, "val": False}


@dataclass
class Imported:
    """A detsweep config tree converted from OD API text, and what could not be carried over.

    Every field the file sets is carried over or named. ``carried`` and ``named`` hold dotted
    paths (:class:`~detsweep.textproto.WrittenField`), each standing for the fields under it:
    a carried path only for the fields detsweep knows, so that an unknown one under it is
    still named; a named path for everything under it (one line for a whole architecture).
    """

    tree: dict[str, Any]
    not_carried: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    carried: set[str] = field(default_factory=set)
    named: set[str] = field(default_factory=set)

    def carry(self, *paths: str) -> None:
        """Record that the tree holds these fields."""
        self.carried.update(paths)

    def leave_out(self, path: str, line: str) -> None:
        """Name ``path`` as not carried over, ``line`` saying which field and why."""
        self.named.add(path)
        if line not in self.not_carried:  # e.g. the same unknown field in two eval readers
            self.not_carried.append(line)

    def note(self, path: str, line: str) -> None:
        """Keep ``path`` as a note (a comment in the written YAML)."""
        self.named.add(path)
        self.notes.append(line)

    def accounts_for(self, written: WrittenField) -> bool:
        return _covered(written.path, self.named) or (written.known and _covered(written.path, self.carried))


def parse(text: str, message_name: str, source: str) -> message.Message:
    """Parse OD API text format into one of the subset's messages, skipping unknown fields."""
    parsed = _CLASSES[message_name]()
    try:
        text_format.Parse(text, parsed, allow_unknown_field=True)
    except text_format.ParseError as error:
        raise DetsweepError(f"{source}: not a valid OD API text proto: {error}") from None
    return parsed


def import_pipeline(text: str, source: str = "pipeline.config") -> Imported:
    """Convert a pipeline.config, an ``optimizer { … }`` block or a bare Optimizer body."""
    pipeline = parse(text, "TrainEvalPipelineConfig", source)
    train = pipeline.train_config
    if pipeline.HasField("optimizer"):
        root, optimizer, optimizer_path = "TrainEvalPipelineConfig", pipeline.optimizer, "optimizer"
    elif pipeline.HasField("train_config"):
        root, optimizer, optimizer_path = "TrainEvalPipelineConfig", train.optimizer, "train_config.optimizer"
    else:  # the body of an Optimizer message, as in the OD API's own tests
        root, optimizer, optimizer_path = "Optimizer", parse(text, "Optimizer", source), ""
    imported = Imported(tree={"optimizer": convert_optimizer(optimizer, source)})
    imported.carry(optimizer_path)  # convert_optimizer reads every field of the subset's optimizers
    _carry_model(pipeline, imported)  # first: the fine-tune note names the preset of its encoder
    if pipeline.HasField("train_config"):
        _carry_train_config(train, imported)
        if pipeline.HasField("optimizer") and train.HasField("optimizer"):
            imported.leave_out("train_config.optimizer",
                               "train_config.optimizer: the top-level optimizer block is used instead")
    _carry_inputs(pipeline, imported)
    if pipeline.HasField("eval_config") and pipeline.eval_config.HasField("batch_size"):
        imported.tree.setdefault("train", {})["eval_batch_size"] = pipeline.eval_config.batch_size
        imported.carry("eval_config.batch_size")
    _name_the_rest(text, root, source, imported)
    return imported


def convert_optimizer(optimizer: message.Message, source: str) -> dict[str, Any]:
    """An OD API ``Optimizer`` message as a detsweep ``optimizer`` section."""
    kind = optimizer.WhichOneof("optimizer")
    if kind is None:
        # optimizer_builder raises on an empty optimizer; so do we.
        raise DetsweepError(f"{source}: optimizer: found no optimizer type, expected one of "
                            "rms_prop_optimizer, momentum_optimizer, adam_optimizer")
    body = getattr(optimizer, kind)
    section: dict[str, Any] = {"type": kind.removesuffix("_optimizer")}
    for name in ("momentum_optimizer_value", "decay", "epsilon"):
        if name in body.DESCRIPTOR.fields_by_name:
            section[name] = as_written(getattr(body, name))
    section["learning_rate"] = _convert_learning_rate(body.learning_rate)
    section["use_moving_average"] = optimizer.use_moving_average
    section["moving_average_decay"] = as_written(optimizer.moving_average_decay)
    return section


def _convert_learning_rate(rate: message.Message) -> dict[str, Any]:
    kind = rate.WhichOneof("learning_rate") or "constant_learning_rate"
    body = getattr(rate, kind)
    section: dict[str, Any] = {"type": kind.removesuffix("_learning_rate").replace("cosine_decay", "cosine")}
    for spec in body.DESCRIPTOR.fields:
        if spec.name == "schedule":
            section["schedule"] = [{"step": s.step, "learning_rate": as_written(s.learning_rate)} for s in body.schedule]
        else:
            section[spec.name] = as_written(getattr(body, spec.name))
    return section


def _carry_train_config(train: message.Message, imported: Imported) -> None:
    section = imported.tree.setdefault("train", {})
    section["batch_size"] = train.batch_size
    imported.carry("train_config.batch_size", "train_config.gradient_clipping_by_norm")
    if train.num_steps:
        section["num_steps"] = train.num_steps
        imported.carry("train_config.num_steps")
    else:
        imported.leave_out("train_config.num_steps",
                           "train_config.num_steps is 0 (train forever): detsweep's default num_steps is used")
    if train.gradient_clipping_by_norm:
        section["gradient_clipping_by_norm"] = as_written(train.gradient_clipping_by_norm)
    if train.use_bfloat16:  # model_lib_v2: `use_bfloat16 and use_tpu`, a flag the file does not hold
        imported.leave_out("train_config.use_bfloat16",
            "train_config.use_bfloat16: the OD API trains in bfloat16 on TPUs only (its --use_tpu); detsweep "
            "keeps float32: with scaling.use_tpu, set train.mixed_precision: mixed_bfloat16")
    else:
        imported.carry("train_config.use_bfloat16")  # float32, as detsweep trains by default
    if train.fine_tune_checkpoint:
        imported.note("train_config.fine_tune_checkpoint", _preset_to_use(train, imported.tree.get("model", {})))
    _carry_augmentations(train.data_augmentation_options, imported)
    if train.HasField("sync_replicas"):
        imported.leave_out("train_config.sync_replicas",
                           "train_config.sync_replicas: detsweep always trains synchronously")


def _preset_to_use(train: message.Message, model: dict[str, Any]) -> str:
    """What ``fine_tune_checkpoint`` becomes here: detsweep starts from keras-hub presets, an image
    encoder's for the OD API's ``classification`` checkpoints and a RetinaNet's for ``detection``
    ones (its model_lib_v2 reads an unset type from ``from_detection_checkpoint``)."""
    kind = train.fine_tune_checkpoint_type or ("detection" if train.from_detection_checkpoint else "classification")
    backbone = model.get("backbone")  # carried only from the zoo's ResNet FPN extractors
    if kind == "detection":
        preset = ("retinanet_resnet50_fpn_coco" if backbone == "resnet50"
                  else "a keras-hub RetinaNet preset of this network (keras-hub's COCO one is a ResNet-50's)")
    else:
        preset = f"resnet_{backbone.removeprefix('resnet')}_imagenet" if backbone else "an image encoder's preset"
    return (f"fine_tune_checkpoint: {train.fine_tune_checkpoint} ({kind}) is an OD API checkpoint; detsweep starts "
            f"from keras-hub presets: set model.weights: {preset} (README: From the OD API's model zoo)")


def _carry_augmentations(options: Any, imported: Imported) -> None:
    """Each step detsweep has becomes the data.augmentation section of its name, every field of it
    as the OD API's builder reads it; the others, and a step given twice, are named."""
    augmentation: dict[str, Any] = {}
    for index, option in enumerate(options):
        kind = _set_field(option)
        path = f"{_AUGMENTATION_OPTIONS}[{index}].{kind}"
        if kind in augmentation:
            imported.leave_out(path, f"{_AUGMENTATION_OPTIONS}.{kind}: given again; detsweep applies "
                               "each step once, with the first one's settings")
        elif kind in AugmentationConfig.model_fields:
            augmentation[kind], fields = _augmentation_step(kind, getattr(option, kind))
            imported.carry(*(f"{path}.{name}" for name in fields))
        elif kind:
            imported.leave_out(path, f"{_AUGMENTATION_OPTIONS}.{kind}: not supported by detsweep")
    _carry_order(augmentation, imported)
    if augmentation:
        imported.tree.setdefault("data", {}).setdefault("augmentation", {}).update(augmentation)


def _carry_order(augmentation: dict[str, Any], imported: Imported) -> None:
    """The OD API applies the steps in the file's order (``augmentation``'s, the first of a step
    given twice): the decoded image's steps in another order than detsweep's default become
    ``order``; the scale jitter, which detsweep applies last (on the resized image), is named
    when the file has such steps after it."""
    steps = list(augmentation)
    in_file_order = [step for step in steps if step in _DECODED_IMAGE_STEPS]
    if in_file_order != [step for step in _DECODED_IMAGE_STEPS if step in augmentation]:
        augmentation["order"] = in_file_order
    jitter = "random_scale_crop_and_pad_to_square"
    after = steps[steps.index(jitter) + 1:] if jitter in steps else []  # each a step on the decoded image
    if after:
        imported.leave_out(f"{_AUGMENTATION_OPTIONS}.{jitter}", f"{_AUGMENTATION_OPTIONS}.{jitter}: before "
                           f"{', '.join(after)} in the file; detsweep applies it last, on the resized image")


def _augmentation_step(kind: str, step: message.Message) -> tuple[Any, list[str]]:
    """An OD API step as its data.augmentation value, and the names of the step's fields it holds."""
    if kind == "random_horizontal_flip":  # the builder passes 0 as None: the function's default
        return as_written(step.probability) or 0.5, ["probability"]
    specs = [spec for spec in step.DESCRIPTOR.fields if f"{_AUGMENTATION_OPTIONS}.{kind}.{spec.name}" not in _WHY_LEFT_OUT]
    section = {spec.name: _step_value(step, spec) for spec in specs}
    if kind == "random_absolute_pad_image":  # the builder's `or 1`, and `or None` (the mean colour)
        section["max_height_padding"] = section["max_height_padding"] or 1
        section["max_width_padding"] = section["max_width_padding"] or 1
        if not section["pad_color"]:
            del section["pad_color"]
    return section, [spec.name for spec in specs]


def _step_value(step: message.Message, spec: FieldDescriptor) -> Any:
    value = getattr(step, spec.name)
    return [as_written(item) for item in value] if spec.is_repeated else as_written(value)


def _carry_model(pipeline: message.Message, imported: Imported) -> None:
    if not pipeline.HasField("model"):
        return
    architecture = pipeline.model.WhichOneof("model")
    if architecture is None:
        return
    if architecture == "ssd":  # with an FPN and a weight-shared box predictor, RetinaNet
        carry_ssd(pipeline.model.ssd, imported)
        return
    num_classes = getattr(pipeline.model, architecture).num_classes
    if num_classes:
        imported.tree.setdefault("model", {})["num_classes"] = num_classes
    # One line for the whole architecture: its fields are detsweep's model section's business.
    imported.leave_out(
        f"model.{architecture}",
        f"model.{architecture}: the architecture is not carried over (detsweep trains model.name, "
        "keras-hub RetinaNet); only num_classes is",
    )


def _carry_inputs(pipeline: message.Message, imported: Imported) -> None:
    readers = []
    if pipeline.HasField("train_input_reader"):
        readers.append(("train", "train_input_reader", pipeline.train_input_reader))
    readers += [("val", "eval_input_reader[0]", reader) for reader in pipeline.eval_input_reader[:1]]
    for split, path, reader in readers:
        paths = list(reader.tf_record_input_reader.input_path)
        if not paths:
            imported.leave_out(path, f"{split} input reader: only tf_record_input_reader is supported")
            continue
        dataset = {"format": "tfrecord", "annotations": ",".join(paths)}
        if reader.label_map_path:
            dataset["label_map"] = reader.label_map_path
        imported.tree.setdefault("data", {})[split] = dataset
        imported.carry(f"{path}.tf_record_input_reader.input_path", f"{path}.label_map_path")
        if reader.shuffle == _SHUFFLES[split]:
            imported.carry(f"{path}.shuffle")
        if split == "train":  # the same names as the OD API's, the same numbers
            for name, setting in (("shuffle_buffer_size", "shuffle_buffer_size"), ("max_number_of_boxes", "max_boxes")):
                if reader.HasField(name):
                    imported.tree["data"][setting] = getattr(reader, name)
                    imported.carry(f"{path}.{name}")
    for index in range(1, len(pipeline.eval_input_reader)):
        imported.leave_out(f"eval_input_reader[{index}]", f"eval_input_reader[{index}]: detsweep evaluates on one "
                           "data.val, the first eval_input_reader")


def _name_the_rest(text: str, root: str, source: str, imported: Imported) -> None:
    """Name every field the file sets that the converters above neither carried over nor named."""
    try:
        written = written_fields(text, _CLASSES[root].DESCRIPTOR)
    except text_format.ParseError as error:  # text_format accepted the text; kept to be safe
        raise DetsweepError(f"{source}: not a valid OD API text proto: {error}") from None
    for field_set in written:
        if not imported.accounts_for(field_set):
            imported.leave_out(field_set.path, f"{field_set.plain_path}: {_why_left_out(field_set)}")


def _why_left_out(field_set: WrittenField) -> str:
    if not field_set.known:
        return "not a field detsweep knows"
    # A subset field missing from the table is still named, never skipped.
    return _WHY_LEFT_OUT.get(field_set.plain_path, "detsweep has no setting for it")


def _covered(path: str, prefixes: set[str]) -> bool:
    """Whether ``path`` is one of ``prefixes`` or lies under one ("" stands for the whole file)."""
    return any(not prefix or path == prefix or path.startswith((f"{prefix}.", f"{prefix}[")) for prefix in prefixes)


def _set_field(msg: message.Message) -> str | None:
    fields = msg.ListFields()
    return fields[0][0].name if fields else None

