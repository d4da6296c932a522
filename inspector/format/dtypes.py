"""The one dtype table: names as torch pickles spell them, and what every layer derives from them.

Each row says the element size, whether it is a float, its safetensors code, its legacy torch storage class,
its `struct` format and its numpy dtype. Scan, plan, the reader, the converter, verify and both torch-zip
codecs take their views from here, so they cannot disagree. numpy (and ml_dtypes, for bf16 and fp8) is
imported only by `numpy_dtype`, so scan stays light; torch is never imported (see `torch_dtype` for tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspector.errors import UnsupportedCheckpointError

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # torch's attribute name: torch.<name>
    itemsize: int
    floating: bool = False
    safetensors: str | None = None  # the header's dtype code; None: safetensors cannot hold it
    storage: str | None = None  # legacy typed storage class (torch pickles the others as UntypedStorage)
    struct: str | None = None  # `struct` format of one element (scalars read without numpy)
    numpy: str = ""  # numpy dtype name, or the ml_dtypes attribute for bf16/fp8


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float64", 8, True, "F64", "DoubleStorage", "<d", "float64"),
        DType("float32", 4, True, "F32", "FloatStorage", "<f", "float32"),
        DType("float16", 2, True, "F16", "HalfStorage", "<e", "float16"),
        DType("bfloat16", 2, True, "BF16", "BFloat16Storage", None, "bfloat16"),
        DType("complex128", 16, False, None, "ComplexDoubleStorage", None, "complex128"),
        DType("complex64", 8, False, "C64", "ComplexFloatStorage", None, "complex64"),
        DType("int64", 8, False, "I64", "LongStorage", "<q", "int64"),
        DType("int32", 4, False, "I32", "IntStorage", "<i", "int32"),
        DType("int16", 2, False, "I16", "ShortStorage", "<h", "int16"),
        DType("int8", 1, False, "I8", "CharStorage", "<b", "int8"),
        DType("uint8", 1, False, "U8", "ByteStorage", "<B", "uint8"),
        DType("bool", 1, False, "BOOL", "BoolStorage", None, "bool"),
        # from torch 2.3 on; older torch cannot load them, but their bytes are plain integers
        DType("uint16", 2, False, "U16", None, "<H", "uint16"),
        DType("uint32", 4, False, "U32", None, "<I", "uint32"),
        DType("uint64", 8, False, "U64", None, "<Q", "uint64"),
        DType("float8_e4m3fn", 1, True, "F8_E4M3", None, None, "float8_e4m3fn"),
        DType("float8_e5m2", 1, True, "F8_E5M2", None, None, "float8_e5m2"),
        DType("float8_e4m3fnuz", 1, True, None, None, None, "float8_e4m3fnuz"),
        DType("float8_e5m2fnuz", 1, True, None, None, None, "float8_e5m2fnuz"),
    )
}

# the short names torch also exports (torch.float is torch.float32) and pickles may spell
TORCH_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
}
TORCH_NAMES = set(DTYPES) | set(TORCH_ALIASES)

ITEMSIZE: dict[str, int] = {d.name: d.itemsize for d in DTYPES.values()}
FLOATING = {d.name for d in DTYPES.values() if d.floating}
STORAGE_DTYPES: dict[str, str] = {d.storage: d.name for d in DTYPES.values() if d.storage}
STORAGE_DTYPES["UntypedStorage"] = "uint8"
STORAGE_CLASSES: dict[str, str] = {d.name: d.storage for d in DTYPES.values() if d.storage}
SAFETENSORS_CODES: dict[str, str] = {d.name: d.safetensors for d in DTYPES.values() if d.safetensors}
FROM_SAFETENSORS: dict[str, str] = {v: k for k, v in SAFETENSORS_CODES.items()}
STRUCT_FORMATS: dict[str, str] = {d.name: d.struct for d in DTYPES.values() if d.struct}

# the user's words for an output dtype
OUTPUT_ALIASES = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
}
# how people write dtypes in a column: fp32, bf16, fp16, fp64 (other names as they are)
SHORT_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name; unknown dtypes are a clear error, not a KeyError."""
    try:
        return ITEMSIZE[dtype]
    except KeyError:
        raise UnsupportedCheckpointError(f"Tensor dtype {dtype!r} is not supported.") from None


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype whose bytes match torch's for `dtype` (bf16 and fp8 through ml_dtypes)."""
    import numpy as np

    d = DTYPES.get(dtype)
    if d is None:
        raise UnsupportedCheckpointError(f"Tensor dtype {dtype!r} is not supported.")
    if d.numpy.startswith(("bfloat16", "float8")):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, d.numpy))
    return np.dtype(d.numpy)


def bits_dtype(dtype: str) -> np.dtype[Any]:
    """`numpy_dtype`, except bf16: its elements as opaque 2-byte values ('V2'), for code that widens their
    bits itself (shifted up 16 they are float32, exactly) and so never imports ml_dtypes, whose import alone
    costs ~0.7 CPU-seconds (more than a health pass of a 200M model). numpy has no arithmetic on 'V2': a
    path that forgets to widen fails loudly instead of computing on the bits as integers. fp8 still comes
    from ml_dtypes (imported then, once: numpy cannot widen it without)."""
    if dtype == "bfloat16":
        import numpy as np

        return np.dtype("V2")
    return numpy_dtype(dtype)


def torch_dtype(dtype: str) -> Any:
    """torch.<dtype>, or None where this torch lacks it (uint16/32/64 arrived in 2.3). Tests and tools only:
    importing torch costs seconds and hundreds of MiB, so nothing on the convert path calls this."""
    import torch

    return getattr(torch, dtype, None)
