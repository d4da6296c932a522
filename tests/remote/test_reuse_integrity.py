"""Integrity of reused outputs in a bucket: an object is reused by a rerun (or a finishing run of `--part`s)
only when the store's own CRC-32 of its bytes equals the CRC-32 its metadata records. Metadata anyone can
copy, a sibling's job id with a made-up CRC-32 over foreign bytes of the same size, is rewritten, not
published."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.remote.conftest import BUCKET
from tests.remote.test_upload import _prefix, _url, objects

pytestmark = pytest.mark.s3


def _forge(client: Any, key: str, *, checksum: bool) -> bytes:
    """Replace `key` with foreign bytes of the same size, its metadata (job id, CRC-32) copied as it was."""
    head = client.head_object(Bucket=BUCKET, Key=key)
    foreign = os.urandom(head["ContentLength"])
    extra = {"ChecksumAlgorithm": "CRC32"} if checksum else {}
    client.put_object(Bucket=BUCKET, Key=key, Body=foreign, Metadata=head["Metadata"], **extra)
    return foreign


@pytest.mark.parametrize("checksum", [True, False])
def test_a_forged_object_with_this_jobs_metadata_is_rewritten(
    checksum: bool, s3_demo: tuple[str, Path], s3_client: Any, cli: Any
) -> None:
    _, local = s3_demo
    url = _url("forged")
    args = ("--format", "weights", "--shard-size", "1MB")
    assert cli("convert", local, url, *args).rc == 0
    good = objects(s3_client, url)
    shard = sorted(n for n in good if n.endswith(".safetensors"))[1]
    foreign = _forge(s3_client, _prefix(url) + shard, checksum=checksum)
    assert objects(s3_client, url)[shard] == foreign
    again = cli("convert", local, url, *args)
    assert again.rc == 0, again.output
    assert objects(s3_client, url) == good  # the foreign bytes were not kept


def test_an_upload_carries_the_stores_own_crc32_equal_to_the_recorded_one(
    s3_demo: tuple[str, Path], s3_client: Any, cli: Any
) -> None:
    """Single PUTs and multipart uploads alike (BIG's shards go up in parts)."""
    from inspector.remote.upload import proven_crc

    _, local = s3_demo
    url = _url("checksummed")
    assert cli("convert", local, url, "--format", "weights", "--shard-size", "6MB").rc == 0
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=_prefix(url)):
        for obj in page["Contents"]:
            head = s3_client.head_object(Bucket=BUCKET, Key=obj["Key"], ChecksumMode="ENABLED")
            assert proven_crc(head, head["Metadata"].get("zi-crc32")) is not None, obj["Key"]
