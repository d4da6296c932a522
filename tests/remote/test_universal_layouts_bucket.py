"""A universal checkpoint written from each model-parallel layout into a bucket (moto's S3 server): the same
bytes a local conversion writes, and `verify` reads it back from the bucket, as for a data-parallel one
(tests/remote/test_upload.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inspector.convert.bucket import plan_output
from inspector.convert.kinds import Request, get, of_output
from inspector.convert.verify import VerifyResult
from inspector.scan.scanner import scan
from tests.remote.proxy import S3Proxy
from tests.remote.test_upload import _run, _url, local_files, objects, open_uploads
from tests.scan.layout_cases import ckpt_dir

pytestmark = pytest.mark.s3


@pytest.mark.parametrize("layout", ["tp_z2_bf16_dp2", "pp_z1_bf16_dp2", "moe_z2_bf16_ws4"])
def test_a_layouts_universal_goes_to_a_bucket_byte_for_byte(
    layout: str, tmp_path: Path, s3_client: Any, proxy: S3Proxy
) -> None:
    ckpt = scan(str(ckpt_dir(layout)))
    local = tmp_path / "local"
    _run(get("universal").plan(ckpt, Request(), str(local)))
    url = _url(f"uni-{layout}")
    job = plan_output(get("universal"), ckpt, Request(), url, str(tmp_path / "staging"))
    job.check_output(overwrite=False)
    _run(job)
    assert objects(s3_client, url) == local_files(local) and open_uploads(s3_client, url) == []
    found = of_output(url)
    assert found.name == "universal"
    result = [ev for ev in found.verify(ckpt, url) if isinstance(ev, VerifyResult)][-1]
    assert result.ok and result.checked > 0, result
