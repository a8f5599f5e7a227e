"""The one op contract of ``LoRAOpPluginDynamic``.

Every other piece (ONNX inject/decompose, NumPy reference, CUDA kernel launcher, TensorRT glue, PEFT packing) reads
names, shapes, dtypes and fields from here, so they cannot drift apart.

Inputs, in this order (``INPUT_NAMES``):

=========== ========================================== ======== ===================================================
input       shape                                      dtype    meaning
=========== ========================================== ======== ===================================================
x           [T, H] or [B, S, H]                        D        activations entering the target projection
y           x.shape[:-1] + [O]                         D        that projection's output (the op's output aliases it)
lora_a      [N, H, R]                                  D        slot pool of down-projections, unused columns zero
lora_b      [N, R, O]                                  D        slot pool of up-projections, unused rows zero
slot_ids    x.shape[:-1] (per token) or [B] (per seq)  int32    adapter slot in [0, N), or -1 for no adapter
scales      [N]                                        float32  alpha / rank (alpha / sqrt(rank) for rsLoRA)
=========== ========================================== ======== ===================================================

D is one of float16, bfloat16, float32; all float tensors share it. Output ``out`` = ``y + scales[s] * (x @ lora_a[s])
@ lora_b[s]`` for each token whose slot ``s >= 0`` and ``y`` where ``s == -1``; same shape and dtype as ``y``.
Per-sequence slots need a 3-D ``x``: sequence ``b`` applies slot ``slot_ids[b]`` to all its ``S`` tokens.

Fields (``FIELD_NAMES``, all int32 scalars): ``max_rank`` R, ``num_slots`` N, ``in_features`` H, ``out_features`` O,
``tile`` (block size along H of the kernel's down-projection; the TensorRT tactic).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

from onnx import NodeProto, TensorProto

from trtforge.build_engine.core.errors import InputError

PLUGIN_NAME = "LoRAOpPluginDynamic"
PLUGIN_NAMESPACE = "trtforge"
PLUGIN_VERSION = "1"
ONNX_DOMAIN = PLUGIN_NAMESPACE  # the inject pass puts plugin nodes in this domain (selects the namespace)

INPUT_NAMES: tuple[str, ...] = ("x", "y", "lora_a", "lora_b", "slot_ids", "scales")
X, Y, LORA_A, LORA_B, SLOT_IDS, SCALES = range(6)
OUTPUT_NAMES: tuple[str, ...] = ("out",)
ALIASED_INPUT = Y  # output 0 may reuse y's memory (IPluginV3OneBuildV2.get_aliased_input)

FLOAT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")  # numpy / ml_dtypes names
SLOT_DTYPE = "int32"
SCALE_DTYPE = "float32"
SLOT_ELEM_TYPE: int = TensorProto.INT32  # SLOT_DTYPE and SCALE_DTYPE as ONNX element types
SCALE_ELEM_TYPE: int = TensorProto.FLOAT

MAX_SLOTS = 4096  # the kernel's sort keeps 2 int32 counters per slot in shared memory (<= 32 KiB)
MAX_RANK = 64  # the kernel keeps per-thread rank vectors in registers; 64 bounds them
TILE_CHOICES: tuple[int, ...] = (32, 64, 128, 256)  # tactics: H elements staged per shared-memory step
DEFAULT_TILE = 128
NO_ADAPTER = -1

FIELD_NAMES: tuple[str, ...] = ("max_rank", "num_slots", "in_features", "out_features", "tile")

#: Node domains that select this op: its own, or the default one (an exporter that dropped the domain).
NODE_DOMAINS: tuple[str, ...] = (ONNX_DOMAIN, "")


def is_lora_node(node: NodeProto) -> bool:
    """The one "is this a LoRA plugin node" predicate; ``trtforge.plugins.is_plugin_node`` asks it."""
    return node.op_type == PLUGIN_NAME and node.domain in NODE_DOMAINS


@dataclass(frozen=True)
class LoraFields:
    """The plugin's fields; validated on construction so a bad ONNX attribute fails with its name."""

    max_rank: int
    num_slots: int
    in_features: int
    out_features: int
    tile: int = DEFAULT_TILE

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InputError(f"{PLUGIN_NAME} field {f.name!r} must be an int, got {value!r}")
        if not 1 <= self.max_rank <= MAX_RANK:
            raise InputError(f"{PLUGIN_NAME} field 'max_rank' is {self.max_rank}; it must be in 1..{MAX_RANK}")
        if not 1 <= self.num_slots <= MAX_SLOTS:
            raise InputError(f"{PLUGIN_NAME} field 'num_slots' is {self.num_slots}; it must be in 1..{MAX_SLOTS}")
        for name in ("in_features", "out_features"):
            if getattr(self, name) < 1:
                raise InputError(f"{PLUGIN_NAME} field {name!r} is {getattr(self, name)}; it must be positive")
        if self.tile not in TILE_CHOICES:
            raise InputError(f"{PLUGIN_NAME} field 'tile' is {self.tile}; choose one of {list(TILE_CHOICES)}")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> LoraFields:
        """From ONNX attributes or TensorRT plugin fields; unknown names are refused, ``tile`` may be omitted."""
        unknown = sorted(set(values) - set(FIELD_NAMES) - {"plugin_namespace"})
        if unknown:
            raise InputError(f"{PLUGIN_NAME}: unknown field(s) {unknown}; expected {list(FIELD_NAMES)}")
        missing = [n for n in FIELD_NAMES[:-1] if n not in values]
        if missing:
            raise InputError(f"{PLUGIN_NAME}: missing field(s) {missing}")
        kwargs = {n: _as_int(n, values[n]) for n in FIELD_NAMES if n in values}
        return cls(**kwargs)  # type: ignore[arg-type]

    # --- serialization: a fixed little-endian layout, independent of TensorRT ---------------------------------
    def to_bytes(self) -> bytes:
        """``b"LORA"`` + version byte + five int32 fields (little-endian): what the plugin stores in an engine."""
        return _MAGIC + struct.pack("<B5i", _FORMAT, *(getattr(self, n) for n in FIELD_NAMES))

    @classmethod
    def from_bytes(cls, data: bytes) -> LoraFields:
        if len(data) != _SIZE or data[:4] != _MAGIC or data[4] != _FORMAT:
            raise InputError(f"{PLUGIN_NAME}: serialized fields are not in format {_FORMAT} ({len(data)} bytes)")
        values = struct.unpack("<5i", data[5:])
        return cls(**dict(zip(FIELD_NAMES, values, strict=True)))


_MAGIC = b"LORA"
_FORMAT = 1
_SIZE = 4 + 1 + 5 * 4


def _as_int(name: str, value: object) -> int:
    """Accept Python ints and NumPy scalars/1-element arrays (TensorRT hands fields over as arrays)."""
    try:
        import numpy as np

        arr = np.asarray(value).reshape(-1)
        if arr.size != 1 or arr.dtype.kind not in "iu":
            raise ValueError
        return int(arr[0])
    except (ValueError, TypeError) as exc:
        raise InputError(f"{PLUGIN_NAME} field {name!r} must be one integer, got {value!r}") from exc


# --- shape rules --------------------------------------------------------------------------------------------------

def output_shape(x_shape: Sequence[int], out_features: int) -> tuple[int, ...]:
    """``x.shape[:-1] + [O]``; the rule TensorRT's get_output_shapes expresses with the expression builder."""
    if len(x_shape) not in (2, 3):
        raise InputError(f"{PLUGIN_NAME}: x must be 2-D [T, H] or 3-D [B, S, H], got shape {list(x_shape)}")
    return (*x_shape[:-1], out_features)


def slot_mode(x_shape: Sequence[int], slot_shape: Sequence[int]) -> str:
    """'token' when slot_ids has x.shape[:-1], 'sequence' when x is 3-D and slot_ids is [B]; else an error."""
    lead = tuple(x_shape[:-1])
    if tuple(slot_shape) == lead:
        return "token"
    if len(x_shape) == 3 and tuple(slot_shape) == (x_shape[0],):
        return "sequence"
    raise InputError(
        f"{PLUGIN_NAME}: slot_ids shape {list(slot_shape)} must be x.shape[:-1] = {list(lead)} (per token)"
        + (f" or [{x_shape[0]}] (per sequence)" if len(x_shape) == 3 else "")
    )


def tokens_per_slot(x_shape: Sequence[int], slot_shape: Sequence[int]) -> int:
    """How many consecutive tokens share one slot id: 1 per token, S per sequence (what the kernel needs)."""
    return 1 if slot_mode(x_shape, slot_shape) == "token" else int(x_shape[1])


def check_shapes(f: LoraFields, shapes: Mapping[str, Sequence[int]]) -> str:
    """Validate a full set of input shapes against the fields; returns the slot mode. Names as in INPUT_NAMES."""
    x, y = tuple(shapes["x"]), tuple(shapes["y"])
    expect = {
        "y": output_shape(x, f.out_features),
        "lora_a": (f.num_slots, f.in_features, f.max_rank),
        "lora_b": (f.num_slots, f.max_rank, f.out_features),
        "scales": (f.num_slots,),
    }
    if x[-1] != f.in_features:
        raise InputError(f"{PLUGIN_NAME}: x has {x[-1]} features, field in_features is {f.in_features}")
    for name, want in expect.items():
        got = tuple(shapes[name]) if name != "y" else y
        if got != want:
            raise InputError(f"{PLUGIN_NAME}: input {name} has shape {list(got)}, expected {list(want)}")
    return slot_mode(x, shapes["slot_ids"])


def input_name(kind: str, target_path: str) -> str:
    """Graph-input names the inject pass adds and the pack command writes: ``lora_a.<module path>`` etc."""
    if kind not in ("lora_a", "lora_b", "lora_scales"):
        raise ValueError(kind)
    return f"{kind}.{target_path}"


SLOT_IDS_INPUT = "lora_slot_ids"  # one shared graph input for every plugin node
#: The dim_param of a 1-D per-token ``lora_slot_ids`` whose token count no graph input names (a 2-D x made by
#: ``Reshape(hidden [batch, sequence, H], [-1, H])``, GPT-2's Conv1D): ``trtforge build`` sizes it batch x sequence.
TOKENS_DIM = "lora_tokens"
