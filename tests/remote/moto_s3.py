"""moto's S3 server on localhost and a folder uploaded into it: one start-up for the remote tests' fixtures
(S3, and the GCS XML stand-in) and the store benchmarks, which put tests/remote/proxy.py in front of it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


@contextmanager
def moto_s3(key_id: str = "zi-test", secret: str = "zi-test") -> Iterator[tuple[int, Any]]:
    """(port, a boto3 client straight to the server) of moto's S3 server on a free localhost port, stopped
    on exit. Needs moto[server] and boto3 (the `test` extra)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        _, port = server.get_host_and_port()
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )
        yield port, client
    finally:
        server.stop()


def upload_folder(client: Any, folder: Path, bucket: str, prefix: str, **extra: str) -> list[str]:
    """Every file below `folder` as `prefix/<its relative path>` in `bucket` (created if missing), in path
    order; `extra` goes to each upload (e.g. ACL="public-read"). Returns the keys."""
    with suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    keys = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        keys.append(f"{prefix}/{path.relative_to(folder).as_posix()}")
        client.upload_file(str(path), bucket, keys[-1], ExtraArgs=extra or None)
    return keys
