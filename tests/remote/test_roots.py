"""The one place a root the user named becomes a byte source: a local folder or a bucket prefix, decided once
from what was named; nothing below asks a path string again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inspector.errors import InspectorError
from inspector.remote.roots import absolute, open_file, parent_source, source_at
from inspector.remote.source import StoreSource
from inspector.system.source import Source


def test_a_path_is_a_local_source_and_a_url_a_store_source(tmp_path: Path) -> None:
    local = source_at(str(tmp_path), "checkpoint")
    assert isinstance(local, Source) and not local.remote and local.label == "checkpoint"
    store = source_at("s3://bucket/run/", "checkpoint")  # no request: a source holds only its URL
    assert isinstance(store, StoreSource) and store.remote and store.root == "s3://bucket/run"
    assert absolute("s3://bucket/run/") == "s3://bucket/run"  # not os.path's /cwd/s3:/bucket/run
    assert absolute("~") == os.path.expanduser("~")
    with pytest.raises(InspectorError):
        source_at("s3://bucket/run/../etc")


def test_a_file_named_directly_is_opened_through_its_own_folder(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"abc")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "link").symlink_to(tmp_path / "f.bin")  # out of its own folder
    assert parent_source(str(tmp_path / "f.bin")).root == os.path.realpath(tmp_path)
    handle = open_file(str(tmp_path / "f.bin"))
    try:
        assert handle.size == 3 and handle.pread(3, 0) == b"abc"
    finally:
        handle.close()
    with pytest.raises(InspectorError, match="leads outside"):  # as the confined source refuses it
        open_file(str(tmp_path / "sub" / "link"))
    assert isinstance(parent_source("s3://bucket/run/latest"), StoreSource)
