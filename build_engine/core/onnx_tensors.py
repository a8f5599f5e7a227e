"""Every ``TensorProto`` of a model, wherever ONNX lets one live: (sparse) initializers, tensor attributes (``t``,
``tensors``, ``sparse_tensor(s)``: Constant values), If/Loop/Scan bodies at any depth, and model-local functions.
``fingerprint`` names a tensor's bytes, so a save can tell which tensors came from external data."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from onnx import GraphProto, ModelProto, NodeProto, SparseTensorProto, TensorProto

# An external data entry is a StringStringEntryProto whose key is "location": field 1, length 8, then field 2. A
# serialised model without these bytes has no tensor on disk (a byte search, at C speed, tells).
LOCATION_KEY = b"\x0a\x08location\x12"


def _sparse(items: Iterable[SparseTensorProto]) -> Iterator[TensorProto]:
    for s in items:
        yield s.values
        yield s.indices


def graph_tensors(graph: GraphProto) -> Iterator[TensorProto]:
    """A graph's tensors: its (sparse) initializers and those of its nodes (``node_tensors``)."""
    yield from graph.initializer
    yield from _sparse(graph.sparse_initializer)
    yield from node_tensors(graph.node)


def node_tensors(nodes: Iterable[NodeProto]) -> Iterator[TensorProto]:
    """The tensors of the nodes' attributes, and every tensor of their subgraphs (recursively)."""
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield from _sparse([attr.sparse_tensor])
            yield from _sparse(attr.sparse_tensors)
            if attr.HasField("g"):
                yield from graph_tensors(attr.g)
            for g in attr.graphs:
                yield from graph_tensors(g)


def besides_initializers(model: ModelProto) -> Iterator[TensorProto]:
    """``model_tensors`` without the main graph's (dense) initializers."""
    yield from _sparse(model.graph.sparse_initializer)
    yield from node_tensors(model.graph.node)
    for fn in model.functions:
        yield from node_tensors(fn.node)


def model_tensors(model: ModelProto) -> Iterator[TensorProto]:
    yield from model.graph.initializer
    yield from besides_initializers(model)


def has_external(model: ModelProto) -> bool:
    """Whether any tensor of the model (``model_tensors``: bodies and functions too) has its data on disk."""
    return any(t.data_location == TensorProto.EXTERNAL for t in model_tensors(model))


def body_fingerprints(model: ModelProto) -> frozenset[tuple[int, bytes]]:
    """The ``fingerprint`` of each in-memory tensor besides the main graph's initializers: as ``onnx_save.save_model``'s
    ``external_tensors``, every one of them of 1 KiB or more goes to the data file (a temporary model past 2 GiB)."""
    return frozenset(fingerprint(t) for t in besides_initializers(model)
                     if t.data_location != TensorProto.EXTERNAL and t.HasField("raw_data"))


def tensor_bytes(model: ModelProto) -> int:
    """The bytes of ``raw_data`` of every tensor of the model (``model_tensors``), bodies and functions included."""
    return sum(len(t.raw_data) for t in model_tensors(model))


def fingerprint(tensor: TensorProto) -> tuple[int, bytes]:
    """(length, digest) of a tensor's ``raw_data``."""
    data = tensor.raw_data
    return len(data), hashlib.blake2b(data, digest_size=16).digest()
