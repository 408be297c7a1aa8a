"""Reading config files: YAML (or an OD API pipeline.config), ``--set`` overrides, validation.

All user mistakes leave here as one-line :class:`DetsweepError` messages of the form
``SOURCE: dotted.path: found X, expected Y``.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from detsweep.errors import DetsweepError

from .schema import TrialConfig

Model = TypeVar("Model", bound=BaseModel)

ODAPI_SUFFIXES = {".config", ".pbtxt", ".txt", ".prototxt"}


# Dataset paths: relative ones are taken from the config file's folder (from the current
# folder for --set), and stored absolute, so Ray workers in other folders find the files.
DATA_PATH = re.compile(r"(^|\.)data\.(train|val)\.(annotations|images|label_map)$")


def load_trial_config(path: str | Path, overrides: Iterable[str] = ()) -> TrialConfig:
    """Read a detsweep YAML file or an OD API pipeline.config, apply ``--set`` overrides, validate."""
    tree = read_trial_tree(path)
    resolve_data_paths(tree, Path(path).parent)
    return validate(TrialConfig, tree, source=str(path), overrides=overrides)


def resolve_data_paths(tree: dict[str, Any], base: Path, prefix: str = "") -> None:
    """Make the dataset paths under ``tree`` (at ``prefix``, e.g. ``base.``) absolute, in place."""
    for split in ("train", "val"):
        dataset = tree
        for key in f"{prefix}data.{split}".split("."):
            dataset = dataset.get(key) if isinstance(dataset, dict) else None
        for field in ("annotations", "images", "label_map"):
            if isinstance(dataset, dict) and isinstance(dataset.get(field), str):
                dataset[field] = absolute_path(dataset[field], base)


def absolute_path(value: str, base: Path) -> str:
    """Each comma-separated part made absolute against ``base``; URIs (gs://, s3://) stay as they are."""
    parts = [p if "://" in p or Path(p).is_absolute() else str(Path(base, p).resolve()) for p in value.split(",")]
    return ",".join(parts)


def merge_trees(tree: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` merged into ``tree`` in place: mappings key by key, anything else replaced."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            merge_trees(tree[key], value)
        else:
            tree[key] = value
    return tree


def read_trial_tree(path: str | Path) -> dict[str, Any]:
    """The raw config tree of a file, before overrides and validation."""
    path = Path(path)
    if path.suffix in ODAPI_SUFFIXES:
        from .odapi import import_pipeline  # protobuf is only needed for OD API files

        return import_pipeline(read_text(path), source=str(path)).tree
    return read_yaml_mapping(path)


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise DetsweepError(f"{path}: file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise DetsweepError(f"{path}: cannot read: {error.__class__.__name__}") from None


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        tree = yaml.safe_load(read_text(path))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise DetsweepError(f"{path}: {where}invalid YAML: {problem}") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise DetsweepError(f"{path}: found a {type(tree).__name__} at the top level, expected a mapping of sections")
    return tree


def validate(model: type[Model], tree: Mapping[str, Any], source: str, overrides: Iterable[str] = (),
             keyed_by_path: Mapping[str, Collection[str]] = {}) -> Model:
    """Apply ``--set`` overrides to ``tree`` and validate it into ``model`` (``keyed_by_path``: see :func:`set_path`)."""
    tree = _deep_copy(tree)
    overridden = {}
    for text in overrides:
        path, value = parse_override(text)
        if DATA_PATH.search(path) and isinstance(value, str):
            value = absolute_path(value, Path.cwd())
        overridden[set_path(tree, path, value, keyed_by_path)] = text
    try:
        return model.model_validate(tree)
    except ValidationError as error:
        raise DetsweepError(describe(error, model, source, overridden)) from None


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b.c=value`` → (``a.b.c``, value parsed as a YAML scalar)."""
    path, sep, raw = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][\w]*(\.[\w]+)*", path.strip()):
        raise DetsweepError(f"--set {text}: expected dotted.path=value, e.g. optimizer.type=adam")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise DetsweepError(f"--set {text}: the value is not valid YAML") from None
    return path.strip(), _yaml_number(value)


def _yaml_number(value: Any) -> Any:
    # PyYAML follows YAML 1.1, where `1e-3` is a string; people mean the number.
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value):
        return float(value)
    return value


def get_path(tree: Mapping[str, Any], path: str, default: Any = None) -> Any:
    node: Any = tree
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def set_path(tree: dict[str, Any], path: str, value: Any, keyed_by_path: Mapping[str, Collection[str]] = {}) -> str:
    """Set ``tree[a][b][c] = value`` for ``a.b.c``, creating mappings on the way; returns the path.

    ``keyed_by_path`` names mappings whose keys are dotted paths themselves (a sweep's
    ``search.space``), each with the field names its values have: ``search.space.optimizer.type.values``
    sets ``values`` of the key ``optimizer.type``.
    """
    for prefix, fields in keyed_by_path.items():
        if path.startswith(prefix + "."):
            mapping = _mapping_at(tree, prefix, path)
            rest = path[len(prefix) + 1:]
            new_key = rest.rsplit(".", 1)[0] if rest.rsplit(".", 1)[-1] in fields else rest
            key = max((k for k in mapping if rest == k or rest.startswith(k + ".")), key=len, default=new_key)
            field = rest[len(key) + 1:]
            if field:
                entry = mapping.setdefault(key, {})
                if not isinstance(entry, dict):
                    raise DetsweepError(f"--set {path}: {prefix}.{key} is {entry!r}, not a section")
                entry[field] = value
            else:
                mapping[key] = value
            return path
    *parents, leaf = path.split(".")
    node: Any = tree
    for depth, key in enumerate(parents):
        child = node.get(key) if isinstance(node, dict) else None
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            where = ".".join(parents[: depth + 1])
            raise DetsweepError(f"--set {path}: {where} is {child!r}, not a section")
        node = child
    node[leaf] = value
    return path


def plain(value: Any) -> Any:
    """``value`` in Python's own types: NumPy scalars (what Tune's searchers draw, what Keras
    reports) become Python numbers and strings, also inside dicts and lists."""
    import numpy as np  # not at import: the command line reads configs without it

    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value.item() if isinstance(value, np.generic) else value


def _mapping_at(tree: dict[str, Any], prefix: str, path: str) -> dict[str, Any]:
    node: Any = tree
    for key in prefix.split("."):
        node = node.setdefault(key, {}) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise DetsweepError(f"--set {path}: {prefix} is {node!r}, not a section")
    return node


def describe(error: ValidationError, model: type[BaseModel], source: str, overridden: Mapping[str, str]) -> str:
    """The first validation error as one line: ``SOURCE: path: found X, expected Y``."""
    first = error.errors(include_url=False)[0]
    loc = [str(part) for part in first["loc"]]
    ctx = first.get("ctx") or {}
    kind = first["type"]
    if kind == "detsweep":
        loc += ctx["field"].split(".")
        found, expected = _show(ctx["found"]), ctx["expected"]
    elif kind == "extra_forbidden":
        found, expected = "an unknown key", _unknown_key_hint(model, loc)
    elif kind == "missing":
        found, expected = "nothing", _description(model, loc) or "a value (this field is required)"
    elif kind == "literal_error":
        choices = re.findall(r"'([^']*)'", ctx.get("expected", ""))
        found = _show(first["input"])
        expected = "one of " + ", ".join(choices) + did_you_mean(first["input"], choices)
    else:
        found, expected = _show(first["input"]), _lowercase_first(first["msg"].removeprefix("Input should be "))
    path = ".".join(loc) or "(top level)"
    origin = _override_for(path, overridden) or source
    return f"{origin}: {path}: found {found}, expected {expected}"


def _override_for(path: str, overridden: Mapping[str, str]) -> str | None:
    for set_at, text in overridden.items():
        if path == set_at or path.startswith(set_at + "."):
            return f"--set {text}"
    return None


def _unknown_key_hint(model: type[BaseModel], loc: list[str]) -> str:
    section = model_at(model, loc[:-1])
    known = list(section.model_fields) if section else []
    return f"one of {', '.join(known)}" + did_you_mean(loc[-1], known)


def _description(model: type[BaseModel], loc: list[str]) -> str | None:
    section = model_at(model, loc[:-1])
    field = section.model_fields.get(loc[-1]) if section else None
    return field.description if field else None


def model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    """The pydantic model class found by following ``loc`` from ``model`` (None: a path that
    leads nowhere, or to a plain value). The one walk of the config's classes."""
    current: Any = model
    for part in loc:
        if part.isdigit():  # list index: the element type was already unwrapped
            continue
        field = current.model_fields.get(part) if _is_model(current) else None
        if field is None:
            return None
        current = _unwrap(field.annotation)
    return current if _is_model(current) else None


def _unwrap(annotation: Any) -> Any:
    """``X | None``, ``list[X]`` and ``Annotated[X, …]`` → ``X`` when X is a model."""
    for arg in typing.get_args(annotation) or ():
        inner = _unwrap(arg)
        if _is_model(inner):
            return inner
    return annotation


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)


def did_you_mean(word: Any, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: Any) -> str:
    """The value as it would be written, unless it is too long for a one-line message."""
    shown = repr(value)
    if isinstance(value, (dict, list)) and len(shown) > 40:
        return "a mapping" if isinstance(value, dict) else "a list"
    return shown


def _lowercase_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _deep_copy(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {key: _deep_copy(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_deep_copy(value) for value in tree]
    return tree
