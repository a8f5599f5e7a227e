"""The view's inlined type facts (``type_facts.type_outputs``, a rule per op read as data) give exactly the facts of
``type_facts.infer_local``, for every default-domain op onnx defines, at every opset from 7 to 23, with inputs of
every combination of known and unknown types drawn at random."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import AttributeProto
from onnx import TensorProto as T

from trtforge.build_engine.passes.type_facts import infer_local, type_outputs
from trtforge_testing import seeded_rng

TYPES = [0, T.FLOAT, T.FLOAT16, T.INT64, T.INT32, T.BOOL, T.DOUBLE, T.UINT8]


@dataclass
class _Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    to: int | None = None
    domain: str = ""
    onnx_op: bool = True

    def attr(self, name: str) -> AttributeProto | None:
        return None


@dataclass
class _Ctx:
    opset: int
    types: dict[str, int] = field(default_factory=dict)
    untyped: list[_Node] = field(default_factory=list)

    def type_of(self, name: str) -> int:
        return self.types.get(name, 0)


def test_inlined_rules_equal_infer_local_for_every_op_and_opset() -> None:
    rng = seeded_rng("type-rules")
    ops = sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""})
    checked = 0
    for opset in range(7, 24):
        for op in ops:
            for _ in range(3):
                n_in = int(rng.integers(0, 5))
                names = [f"i{k}" if rng.random() > 0.15 else "" for k in range(n_in)]
                given = {nm: int(rng.choice(TYPES)) for nm in names if nm}
                to = int(rng.choice(TYPES[1:])) if op == "Cast" else None
                a, b = _Ctx(opset, dict(given)), _Ctx(opset, dict(given))
                left = type_outputs(a, _Node(op, names, ["y"], to))
                infer_local(b, _Node(op, list(names), ["y"], to))
                assert a.types == b.types, (op, opset, names, given)
                assert left == ("y" not in b.types), (op, opset)
                checked += 1
    assert checked > 3000
