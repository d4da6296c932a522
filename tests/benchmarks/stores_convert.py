#!/usr/bin/env python
"""Convert one demo from local disk, from az:// (obstore against Azurite) and from http:// (fsspec against a
ranged http.server): peak RSS (/usr/bin/time -v) and wall time per process, and the bytes each store sent
against the bytes the plan reads (counted by tests/remote/proxy.py in front of each). No throttling: this
checks that memory stays flat and only the plan's ranges are fetched, not how fast a real store is.

    python tests/benchmarks/stores_convert.py --params 200M      # needs Azurite (see tests/remote/servers.py)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.remote.proxy import S3Proxy  # noqa: E402
from tests.remote.servers import _azurite_bin, _files, _port_from, _Ranges, azurite_connection  # noqa: E402

PY = sys.executable


def convert(src: str, out: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(peak RSS in KiB, wall time) of one `convert` in a fresh process."""
    r = subprocess.run(
        ["/usr/bin/time", "-v", PY, "-m", "inspector", "convert", src, out],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})},
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", r.stderr)
    assert rss and wall
    return int(rss.group(1)), wall.group(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="50M")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="zi-stores-")
    try:
        demo = Path(work, "demo")
        subprocess.run(
            [PY, "-m", "inspector", "demo", str(demo), "--params", args.params], check=True, cwd=REPO
        )
        files = _files(demo)
        need = json.loads(
            subprocess.run(
                [PY, "-m", "inspector", "preflight", str(demo), "--json"],
                capture_output=True,
                text=True,
                cwd=REPO,
            ).stdout
        )["read_bytes"]
        print(
            f"demo {args.params}: {sum(p.stat().st_size for p in files):,} bytes on disk, plan reads {need:,}"
        )
        rss, wall = convert(str(demo), f"{work}/out-local")
        print(f"local          peak RSS {rss / 1024:6.1f} MiB  wall {wall}")

        http = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Ranges, directory=work))
        http.daemon_threads = True
        threading.Thread(target=http.serve_forever, daemon=True).start()
        with S3Proxy(http.server_address[1]) as px:
            rss, wall = convert(f"{px.url}/demo", f"{work}/out-http")
            sent = px.throttle.bytes_out
        print(
            f"http (fsspec)  peak RSS {rss / 1024:6.1f} MiB  wall {wall}  fetched {sent / need:.3f}x the plan"
        )
        http.shutdown()

        exe = _azurite_bin()
        if exe is None:
            print("az: Azurite not installed, skipped")
            return
        proc = subprocess.Popen(
            [exe, "--blobHost", "127.0.0.1", "--blobPort", "0", "--location", f"{work}/az", "--silent",
             "--skipApiVersionCheck", "--loose"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            port = _port_from(proc)
            assert port is not None, "Azurite did not start"
            from azure.storage.blob import BlobServiceClient

            container = BlobServiceClient.from_connection_string(
                azurite_connection(f"http://127.0.0.1:{port}")
            ).create_container("ckpt")
            for p in files:
                with p.open("rb") as f:
                    container.upload_blob(f"demo/{p.relative_to(demo).as_posix()}", f)
            with S3Proxy(port) as px:
                env = {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection(px.url)}
                rss, wall = convert("az://ckpt/demo", f"{work}/out-az", env)
                sent = px.throttle.bytes_out
            print(
                f"az (obstore)   peak RSS {rss / 1024:6.1f} MiB  wall {wall}  fetched {sent / need:.3f}x the plan"
            )
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
