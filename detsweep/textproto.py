"""Protobuf message classes built in code from a table of fields, for reading text protos.

detsweep reads a few TF Object Detection API text formats (``pipeline.config``, label
maps) without the OD API's generated code: each reader lists the fields it uses, with
the OD API's names, numbers and proto2 defaults, and this module turns the list into
real message classes, so that protobuf's own ``text_format`` parses the files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

# Field types by the names used in .proto files (descriptor_pb2.FieldDescriptorProto.Type).
SCALARS = {"float": 2, "int64": 3, "int32": 5, "uint32": 13, "bool": 8, "string": 9}


def build_message_classes(
    file_name: str,
    package: str,
    messages: Mapping[str, Sequence[tuple]],
    oneofs: Mapping[str, tuple[str, Sequence[str]]] | None = None,
) -> dict[str, type[message.Message]]:
    """Message classes for ``messages``: ``{name: [(field, number, type[, default[, "repeated"]])]}``.

    A type that is not in :data:`SCALARS` names another message of the table.
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
            else:
                spec.type = spec.TYPE_MESSAGE
                spec.type_name = f".{package}.{kind}"
            if field_name in members:
                spec.oneof_index = 0
    # A pool of our own, so that two tables may reuse message names without clashing.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in messages}
