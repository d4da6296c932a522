"""Every model-parallel layout fixture (real DeepSpeed 0.19.8 runs: experts, pipeline stages, tensor-parallel
shards) read from a store instead of a folder: through fsspec's `memory://` (no server: part of the quick run)
and through moto's S3 server behind our proxy (the `s3` marker, as the other bucket tests): the scan, the
safetensors and the universal checkpoint equal the local ones byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.executor import Report
from inspector.convert.kinds import Request, get
from inspector.convert.options import ConvertOptions
from inspector.convert.plan import build_plan
from inspector.errors import InspectorError
from inspector.scan.json_view import checkpoint_json
from tests.convert.jobs import execute
from tests.remote.compare import without_job
from tests.remote.moto_s3 import upload_folder
from tests.scan.layout_cases import LAYOUTS, NO_UNIVERSAL, NO_UNIVERSAL_WHY, ckpt_dir, scan_layout

BUCKET = "zi-layouts"


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file's bytes, the job fingerprint blanked (it hashes the source's paths, tests/remote/compare.py)."""
    return {
        str(p.relative_to(folder)): without_job(p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _last(events: Iterable[Any]) -> Report:
    return [ev for ev in events if isinstance(ev, Report)][-1]


def _same_as_local(url: str, layout: str, tmp_path: Path) -> None:
    """Scan, fp32 safetensors and (where offered) universal from `url` equal those from the fixture's folder."""
    local = ckpt_dir(layout)
    there, here = scan_layout(layout, url), scan_layout(layout)
    assert json.loads(json.dumps(checkpoint_json(there)).replace(url, str(local))) == checkpoint_json(here)
    for where, ckpt in (("remote", there), ("local", here)):
        execute(build_plan(ckpt, ConvertOptions(dtype="fp32")), str(tmp_path / where))
    assert _tree(tmp_path / "remote") == _tree(tmp_path / "local")
    if layout in NO_UNIVERSAL:  # ZeRO-off pipelines and experts: no universal checkpoint, either way
        for ckpt in (here, there):
            with pytest.raises(InspectorError, match=NO_UNIVERSAL_WHY):
                get("universal").plan(ckpt, Request(), str(tmp_path / "uni"))
        return
    _last(get("universal").plan(here, Request(), str(tmp_path / "uni-local")).run())
    _last(get("universal").plan(there, Request(), str(tmp_path / "uni-remote")).run())
    assert _tree(tmp_path / "uni-remote") == _tree(tmp_path / "uni-local")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_through_fsspec_memory_equals_the_local_one(layout: str, tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    local = ckpt_dir(layout)
    root = f"memory://zi-{layout.replace('_', '-')}/run"  # a bucket each: a store caches its listing
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.pipe(f"{root}/{path.relative_to(local).as_posix()}", path.read_bytes())
    _same_as_local(root, layout, tmp_path)


@pytest.fixture(scope="module")
def layouts_bucket(s3_client: Any) -> str:
    """Every fixture uploaded into a bucket of its own before anything lists it (a store keeps a listing for
    a while, so a prefix uploaded after a scan of the bucket would not be seen by the next)."""
    for layout in LAYOUTS:
        upload_folder(s3_client, ckpt_dir(layout), BUCKET, layout)
    return f"s3://{BUCKET}"


@pytest.mark.s3
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_in_an_s3_bucket_equals_the_local_one(
    layout: str, tmp_path: Path, layouts_bucket: str
) -> None:
    _same_as_local(f"{layouts_bucket}/{layout}", layout, tmp_path)
