#!/usr/bin/env python
"""The store for a paired measurement of the two s3:// clients (boto3, the default; obstore with
ZI_S3_CLIENT=obstore): moto's S3 server holding a demo checkpoint, behind tests/remote/proxy.py run as a
process of its own (per-request latency, per-connection bandwidth cap; ranged GETs answered from the local
copy, since moto reads a whole object for each). It prints the environment to time commands with and serves
until killed; the commands are timed from outside, one fresh process each, the two clients interleaved:

    python tests/benchmarks/s3_clients.py --params 25M --latency-ms 20 --mbps 100 > /tmp/s3env &
    # reads: a bf16 export from the bucket (the fp32 masters, ~4 bytes a parameter)
    env $(cat /tmp/s3env) python -m inspector convert s3://bench/ckpt /tmp/x --dtype bf16
    env $(cat /tmp/s3env) ZI_S3_CLIENT=obstore python -m inspector convert s3://bench/ckpt /tmp/y --dtype bf16
    # writes: the same export from the local copy into a fresh prefix
    env $(cat /tmp/s3env) python -m inspector convert CKPT s3://bench/out-N --dtype fp32
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.remote.moto_s3 import moto_s3, upload_folder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="25M")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--mbps", type=float, default=100.0, help="per-connection cap, MB/s (10^6 bytes)")
    ap.add_argument("--workdir", default="/tmp/zi-s3-clients")
    args = ap.parse_args()
    work = Path(args.workdir)
    ckpt = work / f"demo-{args.params}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if not (ckpt / "latest").exists():
        subprocess.run([sys.executable, "-m", "inspector", "demo", str(ckpt), "--params", args.params], check=True, env=env)
    with moto_s3("bench", "bench") as (port, direct):
        upload_folder(direct, ckpt, "bench", "ckpt")
        proxy = subprocess.Popen(
            [sys.executable, str(REPO / "tests/remote/proxy.py"), "--upstream", str(port),
             "--latency-ms", str(args.latency_ms), "--mbps", str(args.mbps), "--serve-from", f"/bench/ckpt={ckpt}"],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert proxy.stdout is not None
        url = proxy.stdout.readline().strip()
        print(
            f"AWS_ENDPOINT_URL={url} AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 "
            f"AWS_EC2_METADATA_DISABLED=true PYTHONPATH={REPO} ZI_BENCH_CKPT={ckpt}",
            flush=True,
        )
        try:
            threading.Event().wait()
        finally:
            proxy.terminate()


if __name__ == "__main__":
    main()
