"""Protobuf message classes built in code from a table of fields, for reading text protos.

detsweep reads a few TF Object Detection API text formats (``pipeline.config``, label
maps) without the OD API's generated code: each reader lists the fields it uses, with
the OD API's names, numbers and proto2 defaults, and this module turns the list into
real message classes, so that protobuf's own ``text_format`` parses the files.
:func:`written_fields` then lists what a file sets, the fields no table declares
included, so that a reader can say what it leaves out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

# Field types by the names used in .proto files (descriptor_pb2.FieldDescriptorProto.Type).
SCALARS = {"float": 2, "int64": 3, "int32": 5, "uint32": 13, "bool": 8, "string": 9}


def build_message_classes(
    file_name: str,
    package: str,
    messages: Mapping[str, Sequence[tuple]],
    oneofs: Mapping[str, tuple[str, Sequence[str]]] | None = None,
) -> dict[str, type[message.Message]]:
    """Message classes for ``messages``: ``{name: [(field, number, type[, default[, "repeated"]])]}``.

    A type that is not in :data:`SCALARS` names another message of the table, or is an enum
    written ``enum:NAME0,NAME1,…`` (its values numbered from 0, as the OD API's enums are).
    ``oneofs`` maps a message to its one oneof: ``(oneof name, member fields)``.
    """
    oneofs = oneofs or {}
    proto = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto2")
    for name, fields in messages.items():
        msg = proto.message_type.add(name=name)
        oneof_name, members = oneofs.get(name, (None, []))
        if oneof_name:
            msg.oneof_decl.add(name=oneof_name)
        for field_name, number, kind, *rest in fields:
            default, label = (list(rest) + [None, None])[:2]
            spec = msg.field.add(name=field_name, number=number)
            spec.label = spec.LABEL_REPEATED if label == "repeated" else spec.LABEL_OPTIONAL
            if kind in SCALARS:
                spec.type = SCALARS[kind]
                if default is not None:
                    spec.default_value = str(default).lower() if kind == "bool" else str(default)
            elif kind.startswith("enum:"):
                enum = msg.enum_type.add(name=f"{field_name.title().replace('_', '')}Enum")
                for number_of_value, value in enumerate(kind.removeprefix("enum:").split(",")):
                    enum.value.add(name=value, number=number_of_value)
                spec.type, spec.type_name = spec.TYPE_ENUM, f".{package}.{name}.{enum.name}"
                if default is not None:
                    spec.default_value = default
            else:
                spec.type = spec.TYPE_MESSAGE
                spec.type_name = f".{package}.{kind}"
            if field_name in members:
                spec.oneof_index = 0
    # A pool of our own, so that two tables may reuse message names without clashing.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in messages}


@dataclass(frozen=True)
class WrittenField:
    """A field a text proto sets: its dotted path, and whether the message holding it declares it.

    In ``path``, ``[i]`` follows a repeated message field: its i-th occurrence, from 0, so that
    two ``eval_input_reader { … }`` blocks are told apart.
    """

    path: str
    known: bool

    @property
    def plain_path(self) -> str:
        """The path without occurrence numbers, as people name a field."""
        return re.sub(r"\[\d+\]", "", self.path)


def written_fields(text: str, descriptor: Descriptor) -> list[WrittenField]:
    """Every scalar field ``text`` sets that ``descriptor`` declares, and every field it does not.

    A field the descriptor does not declare is listed once, standing for all it holds. ``text``
    must already have parsed with ``text_format`` (unknown fields allowed): this only follows its
    nesting, the way text_format itself skips an unknown field, so it needs no types.
    """
    walker = _FieldWalker(text)
    walker.read_body(descriptor, "")
    return walker.found


class _FieldWalker:
    """Reads a text proto with protobuf's own tokenizer, noting each field it passes."""

    def __init__(self, text: str):
        self.tokens = text_format.Tokenizer(text.splitlines())
        self.found: list[WrittenField] = []

    def read_body(self, descriptor: Descriptor | None, prefix: str) -> None:
        """The fields up to the end of the enclosing message (``descriptor`` is None inside an unknown one)."""
        occurrences: Counter[str] = Counter()
        while not (self.tokens.AtEnd() or self.tokens.LookingAt("}") or self.tokens.LookingAt(">")):
            self.read_field(descriptor, prefix, occurrences)

    def read_field(self, descriptor: Descriptor | None, prefix: str, occurrences: Counter[str]) -> None:
        name = self.read_name()
        path = f"{prefix}.{name}" if prefix else name
        spec = descriptor.fields_by_name.get(name) if descriptor else None
        if descriptor is not None and spec is None:
            self.found.append(WrittenField(path, known=False))
        # As in text_format: a ':' followed by no '{' or '<' introduces a value or a [list].
        if self.tokens.TryConsume(":") and self.tokens.LookingAt("["):
            self.read_list(spec, path, occurrences)
        else:
            self.read_value(spec, path, occurrences)
        if not self.tokens.TryConsume(","):  # fields may end with ',' or ';'
            self.tokens.TryConsume(";")

    def read_name(self) -> str:
        """A field name, or an extension's or Any's bracketed name."""
        if not self.tokens.TryConsume("["):
            return self.tokens.ConsumeIdentifierOrNumber()
        parts = ["["]
        while not self.tokens.TryConsume("]"):
            parts.append(self.tokens.token)
            self.tokens.NextToken()
        return "".join(parts) + "]"

    def read_list(self, spec: FieldDescriptor | None, path: str, occurrences: Counter[str]) -> None:
        self.tokens.Consume("[")
        while not self.tokens.TryConsume("]"):
            self.read_value(spec, path, occurrences)
            self.tokens.TryConsume(",")

    def read_value(self, spec: FieldDescriptor | None, path: str, occurrences: Counter[str]) -> None:
        if self.tokens.LookingAt("{") or self.tokens.LookingAt("<"):
            self.read_message(spec, path, occurrences)
            return
        if not self.tokens.TryConsumeByteString():  # adjacent strings are one value
            self.tokens.NextToken()  # a number, an enum name or a bool: one token
        if spec is not None:
            self.found.append(WrittenField(path, known=True))

    def read_message(self, spec: FieldDescriptor | None, path: str, occurrences: Counter[str]) -> None:
        if spec is not None and spec.is_repeated:
            name = path.rsplit(".", 1)[-1]
            path = f"{path}[{occurrences[name]}]"
            occurrences[name] += 1
        closing = ">" if self.tokens.TryConsume("<") else "}"
        if closing == "}":
            self.tokens.Consume("{")
        self.read_body(spec.message_type if spec else None, path)
        self.tokens.Consume(closing)


def as_written(value: Any) -> Any:
    """float32 fields read back as e.g. 0.004000000189989805; give people the number they wrote."""
    return float(f"{value:.7g}") if isinstance(value, float) else value
