#!/usr/bin/env python
"""Convert (or check the health of) a checkpoint in a throttled S3 store against the local copy: wall time,
peak RSS, bytes fetched against bytes needed, requests, at several requests in flight.

The store is moto's S3 server on localhost behind tests/remote/proxy.py, which adds a per-request latency and
a per-connection bandwidth cap and counts what it sends. moto reads a whole object for every ranged GET, so
the proxy answers ranged GETs itself from one copy of each object (fetched from moto before timing starts);
listings and everything else come from moto. Each convert runs in a fresh process; peak RSS is its own
RSS, sampled every 20 ms.

    python tests/benchmarks/s3_convert.py --params 50M --latency-ms 30 --mbps 100 --inflight 1,8,16
    python tests/benchmarks/s3_convert.py --command health --inflight 8    # every tensor's bytes, once
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from tests.remote.moto_s3 import moto_s3, upload_folder  # noqa: E402
from tests.remote.proxy import S3Proxy  # noqa: E402

MiB = 1 << 20


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes of the child, stderr) of one fresh process. The RSS is sampled every
    20 ms: the child's ru_maxrss would count this process's memory at fork (moto and the proxy hold the
    checkpoint), since Linux carries the parent's high-water mark across fork and exec."""
    from inspector.system.rss import MemorySampler

    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    sampler = MemorySampler(pid=proc.pid, interval=0.02).start()
    _, err = proc.communicate()
    wall = time.monotonic() - start
    peak = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    return wall, peak, err.decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="50M")
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--mbps", type=float, default=100.0, help="per-connection cap, MB/s (10^6 bytes)")
    ap.add_argument("--inflight", default="1,8,16")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--workdir", default="/tmp/zi-s3-bench")
    ap.add_argument("--command", choices=("convert", "health"), default="convert")
    ap.add_argument(
        "--against",
        action="store_true",
        help="health --against a second tag (a hard-linked copy of the first: every byte read twice)",
    )
    args = ap.parse_args()

    import boto3

    work = Path(args.workdir)
    ckpt = work / f"demo-{args.params}"
    py = sys.executable
    base_env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    if not (ckpt / "latest").exists():
        subprocess.run(
            [py, "-m", "inspector", "demo", str(ckpt), "--params", args.params], check=True, env=base_env
        )
    pre = json.loads(
        subprocess.run(
            [py, "-m", "inspector", "preflight", str(ckpt), "--dtype", args.dtype, "--json"],
            check=True,
            capture_output=True,
            env=base_env,
        ).stdout
    )
    need = int(pre["read_bytes"])
    against = ["--against", "before"] if args.against else []
    if args.against:
        tag = ckpt / (ckpt / "latest").read_text().strip()
        if not (ckpt / "before").exists():
            (ckpt / "before").mkdir()
            for f in tag.iterdir():
                os.link(f, ckpt / "before" / f.name)
    if args.command == "health":  # masters, both moments, the 16-bit copy, frozen and buffers
        doc = subprocess.run(
            [py, "-m", "inspector", "health", str(ckpt), "--json", *against],
            capture_output=True,
            env=base_env,
        ).stdout
        need = int(json.loads(doc)["bytes_read"])

    def command(src: str, out: Path) -> list[str]:
        if args.command == "health":
            return [py, "-m", "inspector", "health", src, "--json", *against]
        return [py, "-m", "inspector", "convert", src, str(out), "--dtype", args.dtype]

    on_disk = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())

    rows: list[tuple[str, float, int, int, int]] = []
    with moto_s3("bench", "bench") as (port, direct), S3Proxy(port) as proxy:
        keys = upload_folder(direct, ckpt, "bench", "ckpt")
        via = boto3.client(
            "s3",
            endpoint_url=proxy.url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        proxy.throttle.serve_ranges = True
        for key in keys:  # the proxy's copy of every object, before anything is timed
            via.get_object(Bucket="bench", Key=key, Range="bytes=0-0")["Body"].read()
        env = dict(base_env, AWS_ENDPOINT_URL=proxy.url)
        for n in [int(x) for x in args.inflight.split(",")]:
            out = work / f"out-s3-{n}"
            shutil.rmtree(out, ignore_errors=True)
            proxy.throttle.reset()
            proxy.throttle.serve_ranges = True
            proxy.throttle.latency_s = args.latency_ms / 1000
            proxy.throttle.bytes_per_s = args.mbps * 1e6
            wall, rss, _ = run(command("s3://bench/ckpt", out), dict(env, ZI_S3_INFLIGHT=str(n)))
            rows.append((f"S3, {n} in flight", wall, rss, proxy.throttle.bytes_out, proxy.throttle.requests))
            shutil.rmtree(out, ignore_errors=True)
    out = work / "out-local"
    shutil.rmtree(out, ignore_errors=True)
    wall, rss, _ = run(command(str(ckpt), out), base_env)
    rows.insert(0, ("local disk (page cache warm)", wall, rss, 0, 0))
    shutil.rmtree(out, ignore_errors=True)

    print(
        f"Machine: {platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}. "
        f"Demo {args.params} (ZeRO-2, 2 ranks, bf16 + fp32 masters), {on_disk / MiB:,.0f} MiB on disk; "
        + (
            f"`health` reads {need / MiB:,.1f} MiB"
            if args.command == "health"
            else f"the {args.dtype} plan reads {need / MiB:,.1f} MiB"
        )
        + f". Store: moto + proxy, {args.latency_ms:g} ms per "
        f"request, {args.mbps:g} MB/s per connection.\n"
    )
    print("| run | wall | peak RSS | fetched | × needed | requests | MB/s of needed bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, wall, rss, fetched, reqs in rows:
        ratio = f"{fetched / need:.3f}" if fetched else "–"
        print(
            f"| {name} | {wall:.2f} s | {rss / MiB:.0f} MiB | {fetched / MiB:,.1f} MiB | {ratio} | "
            f"{reqs or '–'} | {need / wall / 1e6:.0f} |"
        )


if __name__ == "__main__":
    main()
