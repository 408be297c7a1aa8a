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
from typing import Any

from google.protobuf import message, text_format

from detsweep.errors import DetsweepError
from detsweep.textproto import WrittenField, build_message_classes, written_fields

_PACKAGE = "detsweep.odapi"

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
    "DetectionModel": [("ssd", 2, "ArchitectureWithClasses"), ("faster_rcnn", 1, "ArchitectureWithClasses"),
                       ("center_net", 6, "ArchitectureWithClasses")],
    "ArchitectureWithClasses": [("num_classes", 1, "int32")],
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
    "EvalConfig": [("num_examples", 2, "uint32", 5000)],
    "InputReader": [
        ("label_map_path", 1, "string"),
        ("shuffle", 2, "bool", True),
        ("tf_record_input_reader", 8, "TFRecordInputReader"),
    ],
    "TFRecordInputReader": [("input_path", 1, "string", None, "repeated")],
    "PreprocessingStep": [
        ("normalize_image", 1, "Empty"),
        ("random_horizontal_flip", 2, "RandomHorizontalFlip"),
        ("random_pixel_value_scale", 3, "Empty"),
        ("random_image_scale", 4, "Empty"),
        ("random_rgb_to_gray", 5, "Empty"),
        ("random_adjust_brightness", 6, "Empty"),
        ("random_adjust_contrast", 7, "Empty"),
        ("random_adjust_hue", 8, "Empty"),
        ("random_adjust_saturation", 9, "Empty"),
        ("random_distort_color", 10, "Empty"),
        ("random_jitter_boxes", 11, "Empty"),
        ("random_crop_image", 12, "Empty"),
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
        ("random_vertical_flip", 25, "Empty"),
        ("random_rotation90", 26, "Empty"),
        ("random_scale_crop_and_pad_to_square", 33, "RandomScaleCrop"),
    ],
    "RandomHorizontalFlip": [("probability", 2, "float", 0.5)],
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
}


_CLASSES = build_message_classes("detsweep_odapi_subset.proto", _PACKAGE, _MESSAGES, _ONEOFS)

# Why the subset's fields that no converter below carries over are left out, by plain path.
_WHY_LEFT_OUT = {
    "train_config.fine_tune_checkpoint_type": "goes with fine_tune_checkpoint, which is kept as a note",
    "train_config.from_detection_checkpoint": "goes with fine_tune_checkpoint, which is kept as a note",
    "train_config.data_augmentation_options.random_scale_crop_and_pad_to_square.output_size":
        "detsweep crops and pads to model.image_size",
    "eval_config.num_examples": "detsweep evaluates every image of data.val",
    "train_input_reader.shuffle": "detsweep always shuffles the training data",
    "eval_input_reader.shuffle": "detsweep reads data.val in order",
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
    if pipeline.HasField("train_config"):
        _carry_train_config(train, imported)
        if pipeline.HasField("optimizer") and train.HasField("optimizer"):
            imported.leave_out("train_config.optimizer",
                               "train_config.optimizer: the top-level optimizer block is used instead")
    _carry_model(pipeline, imported)
    _carry_inputs(pipeline, imported)
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
            section[name] = _clean(getattr(body, name))
    section["learning_rate"] = _convert_learning_rate(body.learning_rate)
    section["use_moving_average"] = optimizer.use_moving_average
    section["moving_average_decay"] = _clean(optimizer.moving_average_decay)
    return section


def _convert_learning_rate(rate: message.Message) -> dict[str, Any]:
    kind = rate.WhichOneof("learning_rate") or "constant_learning_rate"
    body = getattr(rate, kind)
    section: dict[str, Any] = {"type": kind.removesuffix("_learning_rate").replace("cosine_decay", "cosine")}
    for spec in body.DESCRIPTOR.fields:
        if spec.name == "schedule":
            section["schedule"] = [{"step": s.step, "learning_rate": _clean(s.learning_rate)} for s in body.schedule]
        else:
            section[spec.name] = _clean(getattr(body, spec.name))
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
        section["gradient_clipping_by_norm"] = _clean(train.gradient_clipping_by_norm)
    if train.use_bfloat16:  # model_lib_v2: `use_bfloat16 and use_tpu`, a flag the file does not hold
        imported.leave_out("train_config.use_bfloat16",
            "train_config.use_bfloat16: the OD API trains in bfloat16 on TPUs only (its --use_tpu); detsweep "
            "keeps float32: with scaling.use_tpu, set train.mixed_precision: mixed_bfloat16")
    else:
        imported.carry("train_config.use_bfloat16")  # float32, as detsweep trains by default
    if train.fine_tune_checkpoint:
        imported.note("train_config.fine_tune_checkpoint", f"fine_tune_checkpoint: {train.fine_tune_checkpoint} "
                      "(kept as a note: use `detsweep finetune --from checkpoint:PATH` to start from it)")
    _carry_augmentations(train.data_augmentation_options, imported)
    if train.HasField("sync_replicas"):
        imported.leave_out("train_config.sync_replicas",
                           "train_config.sync_replicas: detsweep always trains synchronously")


def _carry_augmentations(options: Any, imported: Imported) -> None:
    for index, option in enumerate(options):
        kind = _set_field(option)
        path = f"train_config.data_augmentation_options[{index}].{kind}"
        if kind == "random_horizontal_flip":
            augmentation = imported.tree.setdefault("data", {}).setdefault("augmentation", {})
            augmentation["random_horizontal_flip"] = _clean(option.random_horizontal_flip.probability)
            imported.carry(f"{path}.probability")
        elif kind == "random_scale_crop_and_pad_to_square":
            crop = option.random_scale_crop_and_pad_to_square
            augmentation = imported.tree.setdefault("data", {}).setdefault("augmentation", {})
            augmentation[kind] = {"scale_min": _clean(crop.scale_min), "scale_max": _clean(crop.scale_max)}
            imported.carry(f"{path}.scale_min", f"{path}.scale_max")
        elif kind:
            imported.leave_out(path, f"train_config.data_augmentation_options.{kind}: not supported by detsweep")


def _carry_model(pipeline: message.Message, imported: Imported) -> None:
    if not pipeline.HasField("model"):
        return
    architecture = pipeline.model.WhichOneof("model")
    if architecture is None:
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


def _clean(value: Any) -> Any:
    """float32 fields read back as e.g. 0.004000000189989805; give people the number they wrote."""
    return float(f"{value:.7g}") if isinstance(value, float) else value
