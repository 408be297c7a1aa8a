"""The OD API's SSD with an FPN and a weight-shared box predictor (its RetinaNet) as detsweep's
``model`` section, field by field (the README's mapping table).

keras-hub's RetinaNet is that network: a ResNet with a feature pyramid, anchors of several
scales and ratios per level, two weight-shared heads of 256-channel convolutions, focal and
smooth-L1 losses. What keras-hub fixes (the heads' width and kernel, their ReLU and missing
batch norm, the initialisers) is carried where the file asks for the same, and named where
it does not.
"""

from __future__ import annotations

from typing import Any, Protocol

from google.protobuf import message

from detsweep.textproto import as_written


class Imported(Protocol):
    """What :class:`detsweep.config.odapi.Imported` offers a converter: the tree it fills, and
    the accounting of every field the file sets."""

    tree: dict[str, Any]

    def carry(self, *paths: str) -> None: ...

    def leave_out(self, path: str, line: str) -> None: ...

ROOT = "model.ssd"
# The zoo's ResNet v1 FPN extractors, by the built-in encoder of the same depth.
RESNETS = {f"ssd_resnet{depth}_v1_fpn_keras": f"resnet{depth}" for depth in (50, 101, 152)}
KERAS_HUB_HEAD_DEPTH, KERAS_HUB_HEAD_KERNEL, KERAS_HUB_FPN_DEPTH = 256, 3, 256


def carry_ssd(ssd: message.Message, imported: Imported) -> None:
    """Carry ``model.ssd`` into ``imported.tree["model"]``; name what cannot be. An SSD
    without a feature pyramid or a weight-shared box predictor (SSD MobileNet v1, say) is
    another network: one line, and only its ``num_classes``."""
    model = imported.tree.setdefault("model", {})
    if ssd.num_classes:
        model["num_classes"] = ssd.num_classes
        imported.carry(f"{ROOT}.num_classes")
    if not is_retinanet(ssd):
        imported.leave_out(ROOT, f"{ROOT}: an SSD without a feature pyramid (feature_extractor.fpn) and a "
                           "weight-shared box predictor is not carried over (detsweep trains keras-hub RetinaNet); "
                           "only num_classes is")
        return
    for part, carry in _PARTS.items():
        if ssd.HasField(part):
            carry(getattr(ssd, part), model, imported)
    _carry_training_switches(ssd, model, imported)


def is_retinanet(ssd: message.Message) -> bool:
    return ssd.feature_extractor.HasField("fpn") and ssd.box_predictor.HasField(
        "weight_shared_convolutional_box_predictor")


def _carry_resizer(resizer: message.Message, model: dict, imported: Imported) -> None:
    path = f"{ROOT}.image_resizer"
    kind = resizer.WhichOneof("image_resizer_oneof")
    if kind is None:
        return
    method = getattr(resizer, kind).resize_method
    _carry_if(imported, f"{path}.{kind}.resize_method", when=method == 0,  # BILINEAR, as tf.image.resize
              why="detsweep resizes bilinearly")
    if kind == "fixed_shape_resizer":
        fixed = resizer.fixed_shape_resizer
        if fixed.height != fixed.width:
            imported.leave_out(f"{path}.fixed_shape_resizer", f"{path}.fixed_shape_resizer: {fixed.height} x "
                               f"{fixed.width}; detsweep's input is a square (model.image_size)")
            return
        model.update(image_size=fixed.height, image_resizer="fixed_shape")
        imported.carry(f"{path}.fixed_shape_resizer.height", f"{path}.fixed_shape_resizer.width")
    else:
        keep = resizer.keep_aspect_ratio_resizer
        model.update(image_size=keep.max_dimension, image_resizer="keep_aspect_ratio")
        inner = f"{path}.keep_aspect_ratio_resizer"
        imported.carry(f"{inner}.max_dimension")
        _carry_if(imported, f"{inner}.pad_to_max_dimension", when=keep.pad_to_max_dimension,
                  why="false: detsweep pads every image to the square")
        _carry_if(imported, f"{inner}.min_dimension", when=keep.min_dimension >= keep.max_dimension,
                  why=f"{keep.min_dimension}: detsweep scales the longer side to max_dimension, where the OD API "
                      "first scales the shorter one to min_dimension")


def _carry_feature_extractor(extractor: message.Message, model: dict, imported: Imported) -> None:
    path = f"{ROOT}.feature_extractor"
    if extractor.type in RESNETS:
        model["backbone"] = RESNETS[extractor.type]
        imported.carry(f"{path}.type")
    elif extractor.type:
        imported.leave_out(f"{path}.type", f"{path}.type: {extractor.type}; detsweep builds "
                           f"{', '.join(RESNETS)} as keras-hub ResNets: for another network, set model.weights to "
                           "a keras-hub image-encoder preset of it")
    if extractor.HasField("fpn"):
        fpn = extractor.fpn
        model.update(min_level=fpn.min_level, max_level=fpn.max_level)
        imported.carry(f"{path}.fpn.min_level", f"{path}.fpn.max_level")
        _carry_if(imported, f"{path}.fpn.additional_layer_depth", when=fpn.additional_layer_depth == KERAS_HUB_FPN_DEPTH,
                  why=f"{fpn.additional_layer_depth}: keras-hub's pyramid is {KERAS_HUB_FPN_DEPTH} channels wide")
    _carry_if(imported, f"{path}.depth_multiplier", f"{path}.min_depth", when=extractor.depth_multiplier == 1.0,
              why=f"{as_written(extractor.depth_multiplier)}: detsweep's ResNets are full width")
    for switch, off in (("use_depthwise", False), ("use_explicit_padding", False), ("pad_to_multiple", 1)):
        _carry_if(imported, f"{path}.{switch}", when=getattr(extractor, switch) == off,
                  why=f"{getattr(extractor, switch)}: detsweep's ResNets do not")
    # detsweep's regulariser covers the ResNet's layers too (regularise_kernels), as the OD API's with true
    _carry_if(imported, f"{path}.override_base_feature_extractor_hyperparams",
              when=extractor.override_base_feature_extractor_hyperparams,
              why="false: the OD API's ResNet keeps its own l2 (1e-4) and batch norm; detsweep applies "
                  "model.l2_regularization to every kernel")
    _carry_hyperparams(extractor.conv_hyperparams, f"{path}.conv_hyperparams", model, imported,
                       batch_norm="keras-hub's ResNet keeps its own batch norm settings")
    if extractor.conv_hyperparams.HasField("initializer"):
        imported.leave_out(f"{path}.conv_hyperparams.initializer", f"{path}.conv_hyperparams.initializer: keras-hub's "
                           "ResNet and pyramid draw their own starting weights")


def _carry_box_predictor(predictor: message.Message, model: dict, imported: Imported) -> None:
    path = f"{ROOT}.box_predictor.weight_shared_convolutional_box_predictor"
    if not predictor.HasField("weight_shared_convolutional_box_predictor"):
        return  # another predictor: an unknown field, named by _name_the_rest
    shared = predictor.weight_shared_convolutional_box_predictor
    model["head_conv_layers"] = shared.num_layers_before_predictor
    model["class_prediction_bias_init"] = as_written(shared.class_prediction_bias_init)
    imported.carry(f"{path}.num_layers_before_predictor", f"{path}.class_prediction_bias_init")
    _carry_if(imported, f"{path}.box_code_size", when=shared.box_code_size == 4,
              why=f"{shared.box_code_size}: keras-hub's box code has 4 values")
    _carry_if(imported, f"{path}.use_dropout", when=not shared.use_dropout, why="true: keras-hub's heads have no dropout")
    _carry_if(imported, f"{path}.depth", when=shared.depth == KERAS_HUB_HEAD_DEPTH,
              why=f"{shared.depth}: keras-hub's heads are {KERAS_HUB_HEAD_DEPTH} channels wide")
    _carry_if(imported, f"{path}.kernel_size", when=shared.kernel_size == KERAS_HUB_HEAD_KERNEL,
              why=f"{shared.kernel_size}: keras-hub's heads use 3 x 3 convolutions")
    _carry_hyperparams(shared.conv_hyperparams, f"{path}.conv_hyperparams", model, imported,
                       batch_norm="keras-hub's heads have no batch norm (group norm at most)")
    initializer = shared.conv_hyperparams.initializer
    if initializer.HasField("random_normal_initializer") and initializer.random_normal_initializer.mean == 0.0:
        model["head_kernel_stddev"] = as_written(initializer.random_normal_initializer.stddev)
        imported.carry(f"{path}.conv_hyperparams.initializer.random_normal_initializer")
    elif shared.conv_hyperparams.HasField("initializer"):
        imported.leave_out(f"{path}.conv_hyperparams.initializer", f"{path}.conv_hyperparams.initializer: detsweep "
                           "draws the heads' kernels from a normal of mean 0 (model.head_kernel_stddev)")


def _carry_hyperparams(hyperparams: message.Message, path: str, model: dict, imported: Imported,
                       batch_norm: str) -> None:
    """``l2_regularizer.weight`` is the model's; the activation is carried when it is keras-hub's
    ReLU; ``batch_norm`` says why the batch norm settings are not."""
    if hyperparams.HasField("batch_norm"):
        imported.leave_out(f"{path}.batch_norm", f"{path}.batch_norm: {batch_norm}")
    if hyperparams.regularizer.HasField("l2_regularizer"):
        weight = as_written(hyperparams.regularizer.l2_regularizer.weight)
        if model.setdefault("l2_regularization", weight) == weight:
            imported.carry(f"{path}.regularizer.l2_regularizer.weight")
        else:
            imported.leave_out(f"{path}.regularizer", f"{path}.regularizer: l2 weight {weight}; detsweep applies one "
                               f"weight to every convolution, the first one the file gives ({model['l2_regularization']})")
    activation = hyperparams.DESCRIPTOR.fields_by_name["activation"].enum_type.values_by_number[hyperparams.activation]
    _carry_if(imported, f"{path}.activation", when=activation.name == "RELU",
              why=f"{activation.name}: keras-hub's ResNet, pyramid and heads use ReLU")


def _carry_box_coder(coder: message.Message, model: dict, imported: Imported) -> None:
    if coder.HasField("faster_rcnn_box_coder"):
        scales = coder.faster_rcnn_box_coder
        model["box_coder_scales"] = [as_written(getattr(scales, f"{axis}_scale")) for axis in ("y", "x", "height", "width")]
        imported.carry(f"{ROOT}.box_coder.faster_rcnn_box_coder")


def _carry_matcher(matcher: message.Message, model: dict, imported: Imported) -> None:
    if not matcher.HasField("argmax_matcher"):
        return
    argmax, path = matcher.argmax_matcher, f"{ROOT}.matcher.argmax_matcher"
    model.update(matched_threshold=as_written(argmax.matched_threshold),
                 unmatched_threshold=as_written(argmax.unmatched_threshold),
                 force_match_for_each_row=argmax.force_match_for_each_row)
    imported.carry(f"{path}.matched_threshold", f"{path}.unmatched_threshold", f"{path}.force_match_for_each_row",
                   f"{path}.use_matmul_gather")  # a TPU speed-up: the same matches
    _carry_if(imported, f"{path}.ignore_thresholds", when=not argmax.ignore_thresholds,
              why="true: keras-hub's matcher always thresholds")
    _carry_if(imported, f"{path}.negatives_lower_than_unmatched", when=argmax.negatives_lower_than_unmatched,
              why="false: in keras-hub's matcher, anchors below unmatched_threshold are negatives")


def _carry_anchors(generator: message.Message, model: dict, imported: Imported) -> None:
    if not generator.HasField("multiscale_anchor_generator"):
        return
    anchors, path = generator.multiscale_anchor_generator, f"{ROOT}.anchor_generator.multiscale_anchor_generator"
    model.update(min_level=anchors.min_level, max_level=anchors.max_level, anchor_size=as_written(anchors.anchor_scale),
                 scales_per_octave=anchors.scales_per_octave)
    if anchors.aspect_ratios:
        model["aspect_ratios"] = [as_written(ratio) for ratio in anchors.aspect_ratios]
    imported.carry(path)  # every field it declares; normalize_coordinates only chooses the anchors' units


def _carry_post_processing(post: message.Message, model: dict, imported: Imported) -> None:
    path = f"{ROOT}.post_processing"
    _carry_if(imported, f"{path}.score_converter", when=post.score_converter == 1,  # SIGMOID
              why="detsweep's scores are sigmoids of the logits (keras-hub's)")
    if not post.HasField("batch_non_max_suppression"):
        return
    nms, inner = post.batch_non_max_suppression, f"{path}.batch_non_max_suppression"
    # unwritten, the OD API's defaults: per class (use_class_agnostic_nms false), 100 kept in each
    model.update(score_threshold=as_written(nms.score_threshold), nms_iou_threshold=as_written(nms.iou_threshold),
                 max_detections=nms.max_total_detections, use_class_agnostic_nms=nms.use_class_agnostic_nms,
                 max_detections_per_class=nms.max_detections_per_class)
    imported.carry(*(f"{inner}.{name}" for name in ("score_threshold", "iou_threshold", "max_total_detections",
                                                     "use_class_agnostic_nms", "max_detections_per_class")))


def _carry_loss(loss: message.Message, model: dict, imported: Imported) -> None:
    path = f"{ROOT}.loss"
    model.update(classification_weight=as_written(loss.classification_weight),
                 localization_weight=as_written(loss.localization_weight))
    imported.carry(f"{path}.classification_weight", f"{path}.localization_weight")
    classification = loss.classification_loss
    if classification.HasField("weighted_sigmoid_focal"):
        focal = classification.weighted_sigmoid_focal
        model.update(focal_gamma=as_written(focal.gamma), classification_loss_over_classes="sum",
                     focal_alpha=as_written(focal.alpha) if focal.HasField("alpha") else None)
        imported.carry(f"{path}.classification_loss.weighted_sigmoid_focal")
    elif classification.HasField("weighted_sigmoid"):  # focal loss with gamma 0, unweighted
        model.update(focal_gamma=0.0, focal_alpha=None, classification_loss_over_classes="sum")
    if loss.localization_loss.HasField("weighted_smooth_l1"):
        model["smooth_l1_delta"] = as_written(loss.localization_loss.weighted_smooth_l1.delta)
        imported.carry(f"{path}.localization_loss.weighted_smooth_l1.delta")


def _carry_training_switches(ssd: message.Message, model: dict, imported: Imported) -> None:
    """The SSD's own flags the file sets; the box loss's normalisation also at the OD API's
    default once the file describes the network (a loss): a bare ``ssd { num_classes }``
    sets nothing else. (``iou_similarity`` is keras-hub's matcher's: it has no field to carry.)"""
    if ssd.HasField("loss") or ssd.HasField("normalize_loc_loss_by_codesize"):
        model["normalize_loc_loss_by_codesize"] = ssd.normalize_loc_loss_by_codesize
        imported.carry(f"{ROOT}.normalize_loc_loss_by_codesize")
    imported.carry(f"{ROOT}.inplace_batchnorm_update")  # Keras updates batch norm in place
    for flag, ours, why in (
        ("normalize_loss_by_num_matches", True, "false: detsweep divides the loss by the matched anchors"),
        ("encode_background_as_zeros", True, "false: detsweep's classes are sigmoids with no background class"),
        ("add_background_class", False, "true: the OD API adds an always-zero background column; detsweep's "
                                        "sigmoid classes have none"),
        ("freeze_batchnorm", False, "true: detsweep trains batch norm (model.use_sync_bn syncs it)"),
        ("negative_class_weight", 1.0, "negatives weigh as much as positives in detsweep's loss"),
    ):
        if ssd.HasField(flag):
            _carry_if(imported, f"{ROOT}.{flag}", when=getattr(ssd, flag) == ours,
                      why=why if isinstance(ours, bool) else f"{as_written(getattr(ssd, flag))}: {why}")


def _carry_if(imported: Imported, *paths: str, when: bool, why: str = "") -> None:
    """Carry ``paths`` when detsweep does what they say; else name each, ``why`` saying what differs."""
    for path in paths:
        if when:
            imported.carry(path)
        else:
            imported.leave_out(path, f"{path}: {why}")


_PARTS: dict[str, Any] = {
    "image_resizer": _carry_resizer,
    "feature_extractor": _carry_feature_extractor,
    "box_predictor": _carry_box_predictor,
    "box_coder": _carry_box_coder,
    "matcher": _carry_matcher,
    "anchor_generator": _carry_anchors,
    "post_processing": _carry_post_processing,
    "loss": _carry_loss,
}
