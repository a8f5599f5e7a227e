"""The one place that knows which ONNX element types embed which (the safety test of every Cast rule).

``U`` *embeds* ``T`` when every value of ``T`` (including -0.0, +-inf and NaN where ``T`` has them) converts to
``U`` exactly, and converting back gives the same value. Then ``Cast(Cast(x, U), T) == x`` and
``Cast(Cast(x, U), V) == Cast(x, V)`` for every ``x`` of type ``T``, because ONNX Cast is a function of the value
alone. ``tests/build_engine/passes/test_dtypes.py`` proves this table against ``onnx.reference``: exhaustively for
every 8- and 16-bit type and on boundary plus random values for 32- and 64-bit types, in both directions (every
entry holds, and every pair that is missing has a counterexample).

Notable non-embeddings: float32 does not embed int32 (2**24 + 1), float16 does not embed bfloat16 (range), bfloat16
does not embed float16 (precision), no integer type embeds a float type (truncation), bool embeds nothing but itself
(``Cast(x, bool)`` maps every non-zero to true), and float8e5m2 embeds in nothing because Cast back to it
saturates +-inf to +-57344 (its default ``saturate=1``). Types not listed here (strings, complex, 4-bit types,
float8e8m0) embed nothing but themselves, so only a Cast to their own type is removed (not float8e8m0's:
``same_type_cast_is_identity``).
"""

from __future__ import annotations

from onnx import TensorProto as TP

B, U8, I8, U16, I16 = TP.BOOL, TP.UINT8, TP.INT8, TP.UINT16, TP.INT16
U32, I32, U64, I64 = TP.UINT32, TP.INT32, TP.UINT64, TP.INT64
F16, BF16, F32, F64 = TP.FLOAT16, TP.BFLOAT16, TP.FLOAT, TP.DOUBLE
E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ = TP.FLOAT8E4M3FN, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2, TP.FLOAT8E5M2FNUZ

FLOAT8 = frozenset({E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ})
FLOATS = frozenset({F16, BF16, F32, F64}) | FLOAT8
SIGNED = frozenset({I8, I16, I32, I64})
UNSIGNED = frozenset({U8, U16, U32, U64})
INTS = SIGNED | UNSIGNED
#: Every type the table speaks about (the tests enumerate these).
KNOWN = FLOATS | INTS | {B}

_NUMERIC_NO_BOOL = KNOWN - {B}

#: EMBEDDED_IN[T] = the types U != T that embed T. ONE table; every rule asks ``embeds(U, T)``.
EMBEDDED_IN: dict[int, frozenset[int]] = {
    B: frozenset(_NUMERIC_NO_BOOL),  # 0 and 1 are exact everywhere; U -> bool maps 1 back to true
    I8: frozenset({I16, I32, I64, F16, BF16, F32, F64}),  # |x| <= 128 <= 2**8 (bf16 has 8 significant bits)
    U8: frozenset({U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64}),
    I16: frozenset({I32, I64, F32, F64}),  # not fp16 (11 bits) nor bf16 (8 bits)
    U16: frozenset({U32, I32, U64, I64, F32, F64}),
    I32: frozenset({I64, F64}),  # not fp32: 2**24 + 1
    U32: frozenset({U64, I64, F64}),
    I64: frozenset(),  # not fp64: 2**53 + 1
    U64: frozenset(),
    F16: frozenset({F32, F64}),  # not bf16: 65504 > bf16 precision, 2**-24 fine but 1 + 2**-10 not
    BF16: frozenset({F32, F64}),  # not fp16: range 3.4e38
    F32: frozenset({F64}),
    F64: frozenset(),
    E4M3FN: frozenset({F16, BF16, F32, F64}),
    E4M3FNUZ: frozenset({F16, BF16, F32, F64}),
    # float8e5m2 has +-inf, and Cast back to it saturates them to +-57344 by default (saturate=1): never a round trip
    E5M2: frozenset(),
    E5M2FNUZ: frozenset({F16, BF16, F32, F64}),
}


def embeds(u: int, t: int) -> bool:
    """True when type ``u`` holds every value of type ``t`` exactly and ``Cast(., to=t)`` (default attributes)
    gives them back; ``u == t`` is true for every known type except float8e5m2 (saturation of +-inf)."""
    if u == t:
        return t in KNOWN and t != E5M2
    return u in EMBEDDED_IN.get(t, frozenset())


#: Types every value of which is exactly a float32: casting them to float16/bfloat16 is one rounding in every
#: runtime, whatever path (direct, or through float32/float64) it takes.
_FLOAT32_EXACT = frozenset({B, I8, U8, I16, U16, F16, BF16, F32}) | FLOAT8

_INT_RANGE: dict[int, tuple[int, int]] = {
    B: (0, 1), I8: (-2**7, 2**7 - 1), U8: (0, 2**8 - 1), I16: (-2**15, 2**15 - 1), U16: (0, 2**16 - 1),
    I32: (-2**31, 2**31 - 1), U32: (0, 2**32 - 1), I64: (-2**63, 2**63 - 1), U64: (0, 2**64 - 1),
}


def cast_defined(s: int, v: int) -> bool:
    """``Cast(x, to=v)`` has, for EVERY value ``x`` of type ``s`` (NaN, +-inf, -0.0, subnormals, the extremes), one
    result that the ONNX spec fixes and every runtime computes alike. Rules that remove or merge Casts
    (``cast_chain``, ``sink_cast``, ``duplicate_cast``) fire only on such casts. Not defined:

    - float -> integer: NaN, +-inf and out-of-range values are undefined in the spec (onnx.reference gives INT_MIN
      for ``double(2**31) -> int32``, a wrap-around path gives ``-2**31 + ...``, NaN -> uint32 differs by source type);
    - float -> bool: NaN (the spec says true; runtimes testing ``x != 0`` vs ``(bool)x`` differ);
    - integer -> narrower integer when a value of ``s`` lies outside ``v``'s range (the spec wraps, runtimes such
      as TensorRT clamp);
    - to bfloat16 from a type whose values are not all exactly float32 (int32/uint32/64-bit ints, double), to
      float16 from double: runtimes round through float32 first or not (two roundings differ from one at ties:
      ``2**30 + 2**22 + 1``, ``1 + 2**-11 + 2**-40``), and int64/uint64 -> float32 likewise (through float64 or
      not). Integer -> float16 is defined: below 2**24 every path is exact before the one rounding, and above
      65519 every path gives inf;
    - to any float8 type except from bool: saturation and rounding modes are attributes whose defaults changed.
    """
    if s not in KNOWN or v not in KNOWN:
        return False
    if s in (v, B):
        return True
    if v in FLOAT8:
        return False
    if v == B:
        return s in INTS
    if v in INTS:
        if s not in INTS:
            return False
        lo, hi = _INT_RANGE[s]
        vlo, vhi = _INT_RANGE[v]
        return vlo <= lo and hi <= vhi
    if v == F64:
        return True
    if v == F32:
        return s not in (I64, U64)
    return s in _FLOAT32_EXACT or (v == F16 and s in INTS)


def same_type_cast_is_identity(t: int, saturate: int | None) -> bool:
    """``Cast(x, to=t)`` on an ``x`` already of type ``t`` returns ``x``: always, except that float8e5m2 with
    ``saturate=1`` (the default) turns +-inf into +-57344, and float8e8m0, whose Cast rounds (``round_mode``) through
    float32 in onnx.reference: its smallest value 2**-127 (a float32 subnormal) comes back as 2**-126."""
    if t in (TP.UNDEFINED, TP.FLOAT8E8M0):
        return False
    return t != E5M2 or saturate == 0


def name(t: int) -> str:
    """A short readable name (``float16``) for messages and reports."""
    try:
        return TP.DataType.Name(t).lower()
    except ValueError:
        return f"type{t}"


# First default-domain opset at which generic type constraints ("all tensor types") include a type.
_MIN_OPSET: dict[int, int] = {int(BF16): 13} | {int(t): 19 for t in FLOAT8}

#: Ops whose output holds, element for element, values taken from their first input (no arithmetic), and which
#: accept every tensor type. Moving a Cast across one of them commutes: Cast(M(x)) == M(Cast(x)).
DATA_MOVEMENT = frozenset({
    "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Slice", "Gather",
    "GatherElements", "GatherND", "Tile", "DepthToSpace", "SpaceToDepth",
})


def op_accepts(t: int, opset: int) -> bool:
    """Whether generic ops ('all tensor types': Shape, Reshape, Transpose, ...) accept ``t`` at ``opset``."""
    return t != TP.UNDEFINED and opset >= _MIN_OPSET.get(t, 1)
