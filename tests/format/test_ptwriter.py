"""ptwriter's in-hand checksum: `dump_crc` gives the CRC-32 of the very bytes it wrote, without reading them."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest

from inspector.format import ptwriter as pw


@pytest.mark.parametrize("chunk", [7, 1000, 1 << 20])
@pytest.mark.parametrize("numel", [5000, pw.DIRECT // 4, pw.DIRECT // 4 + 1, 3 * pw.DIRECT])
def test_dump_crc_is_the_written_files_crc(chunk: int, numel: int) -> None:
    """Small entries carry the file's CRC through their bytes, big ones combine it: both, and the switch
    between them within one entry, give the file's own CRC-32."""
    fh, again = io.BytesIO(), io.BytesIO()
    size, crc = pw.dump_crc(_tree(numel), fh, "fp32", chunk)
    data = fh.getvalue()
    assert size == len(data) and crc == zlib.crc32(data)
    assert pw.dump(_tree(numel), again, "fp32", chunk) == size  # dump writes the same bytes
    assert again.getvalue() == data


def _tree(numel: int = 5000) -> dict[str, object]:
    """A universal tensor file's tree (a storage is keyed by the dump that writes it: a fresh one each)."""
    values = np.arange(numel, dtype=np.float32)
    storage = pw.Storage("float32", values.size, lambda s, n: values[s : s + n])
    empty = pw.Tensor(pw.Storage("float32", 0), (0,))
    return {"param": pw.Tensor(storage, (numel,)), "cat_dim": 0, "empty": empty}


def test_dump_crc_refuses_a_file_already_written_to() -> None:
    fh = io.BytesIO()
    fh.write(b"x")
    with pytest.raises(ValueError, match="start empty"):
        pw.dump_crc({"a": 1}, fh, "a")
