"""Names with `?` and `#` (plain characters of an S3 key, a query and a fragment in an http URL) round-trip
through a bucket: a checkpoint whose tag and prefix hold them is scanned and converted from it, and a
conversion into such a prefix is verified from there."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.remote.compare import assert_same_files
from tests.remote.conftest import BUCKET, SPEC, upload
from tests.remote.test_upload import objects

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def odd_demo(s3_client: Any, demo: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The demo in the bucket under `odd#1/run?x`, beside a file named `notes?v=1#a.txt`."""
    local = tmp_path_factory.mktemp("odd") / "ckpt"
    shutil.copytree(demo(SPEC), local)
    (local / "notes?v=1#a.txt").write_text("a file the scan lists and leaves alone")
    upload(s3_client, local, "odd#1/run?x")
    return f"s3://{BUCKET}/odd#1/run?x", local


def test_a_checkpoint_under_names_with_query_and_fragment_characters_is_scanned_and_converted(
    odd_demo: tuple[str, Path], cli: Any, tmp_path: Path
) -> None:
    url, local = odd_demo
    scanned = cli("scan", url)
    assert scanned.rc == 0, scanned.output
    assert cli("convert", url, tmp_path / "remote").rc == 0
    assert cli("convert", local, tmp_path / "local").rc == 0
    assert_same_files(tmp_path / "remote", tmp_path / "local")


def test_an_output_prefix_with_query_and_fragment_characters_is_verified_from_the_bucket(
    odd_demo: tuple[str, Path], s3_client: Any, cli: Any, tmp_path: Path
) -> None:
    url, local = odd_demo
    out = f"s3://{BUCKET}/out#2/conv?y=2"
    done = cli("convert", local, out)
    assert done.rc == 0, done.output
    assert objects(s3_client, out)
    checked = cli("verify", url, out)
    assert checked.rc == 0, checked.output
    assert "OK" in checked.stdout
