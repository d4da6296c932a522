"""Real store servers on localhost for the object-store tests, each with a demo checkpoint uploaded: moto's
S3 server behind our proxy (which can inject faults and lie); more in tests/remote/servers.py (Azurite, a
GCS XML stand-in, a plain HTTP server). A test whose server's packages are missing is skipped (the `s3`
and `test` extras bring moto and boto3; `tox -e remote` the rest)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inspector.demo.writer import DemoSpec
from tests.remote.moto_s3 import moto_s3, upload_folder
from tests.remote.proxy import S3Proxy
from tests.remote.servers import az_demo, azurite, gs_demo, gs_server, http_demo  # noqa: F401  (fixtures)

BUCKET = "ckpt"
SECRET = "zi-test-secret-never-printed"
SPEC = DemoSpec()  # stage 2, 2 ranks, bf16 with fp32 masters, 2M parameters
# stage 3 on 4 ranks: per-parameter partitions, a run in every rank file per chunk, the rank proof's reads
SPEC3 = DemoSpec(stage=3, world_size=4, params=1_000_000)


@pytest.fixture(scope="session")
def s3_proxy() -> Iterator[S3Proxy]:
    """moto on a random port, our proxy in front; the environment points every client at the proxy."""
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    env = {
        "AWS_ACCESS_KEY_ID": "zi-test",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata probe (seconds of timeouts)
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_MAX_ATTEMPTS": "3",
    }
    with moto_s3() as (port, _), S3Proxy(port) as proxy, pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("AWS_PROFILE", raising=False)
        mp.setenv("AWS_ENDPOINT_URL", proxy.url)
        yield proxy


@pytest.fixture
def proxy(s3_proxy: S3Proxy) -> Iterator[S3Proxy]:
    """The proxy with no fault, no delay and zeroed counters, reset again after the test."""
    s3_proxy.throttle.reset()
    yield s3_proxy
    s3_proxy.throttle.reset()


def upload(client: Any, folder: Path, prefix: str) -> None:
    upload_folder(client, folder, BUCKET, prefix)


@pytest.fixture(scope="session")
def s3_client(s3_proxy: S3Proxy) -> Any:
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture(scope="session")
def s3_demo(s3_client: Any, demo: Any) -> tuple[str, Path]:
    """(URL, local root) of the same demo checkpoint in the bucket and on disk."""
    local = demo(SPEC)
    upload(s3_client, local, "stage2/demo")
    return f"s3://{BUCKET}/stage2/demo", local


@pytest.fixture(scope="session")
def s3_demo3(s3_client: Any, demo: Any) -> tuple[str, Path]:
    """The stage-3 demo, in the bucket and on disk."""
    local = demo(SPEC3)
    upload(s3_client, local, "stage3/demo")  # its own first-level prefix: listings are kept 10 s
    return f"s3://{BUCKET}/stage3/demo", local
