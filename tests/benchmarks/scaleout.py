#!/usr/bin/env python
"""Scale-out over a store that caps each node: one process against `--part i/N` (N processes at once plus
the finishing run) and against `--executor ray` on N Ray nodes, every node reading through a link of its own.

The store is moto's S3 server on localhost with one throttling proxy per node in front of it
(tests/remote/proxy.py, each a process of its own): each proxy caps all its connections together at
`--node-mbps` (the node's share of the store, or its NIC), adds `--latency-ms` per request, and answers
ranged GETs from the local copy of the checkpoint (moto reads a whole object for every ranged GET). A part i
gets AWS_ENDPOINT_URL=proxy i; Ray's node i is started with it in its environment, and the driver runs with
ZI_RAY_AWS_ENV=node so its own endpoint is not handed to the tasks. The single run, the finishing runs and
the Ray driver read through the head proxy, capped the same. Reported: wall, against one node's wall divided by N (the
target: within 1.3 of it), bytes fetched against the plan's, requests, the peak RSS of each process (sampled every 20 ms).

With `--sweep 1,8,16` it measures one process at that many requests in flight instead (`--mbps` per
connection, no node cap), the proxy out of process, with the CPU seconds of the converter and the proxy;
with `--fetch-only` as well, only the fetch phase of the plan's reads (tests/benchmarks/fetch_plan.py: the
converter's chunks and requests in flight, no cast, no write), timed inside the process after its scan.

    python tests/benchmarks/scaleout.py --params 50M --node-mbps 10 --parts 2,4 --ray 2,4 --runs 3
    python tests/benchmarks/scaleout.py --params 50M --sweep 1,8,16 --mbps 100 --latency-ms 30 --runs 3
    python tests/benchmarks/scaleout.py --params 50M --sweep 1,8,16 --fetch-only --mbps 100 --runs 3
"""

from __future__ import annotations

import argparse
import filecmp
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

MiB = 1 << 20
PY = sys.executable
BUCKET, PREFIX = "bench", "ckpt"
URL = f"s3://{BUCKET}/{PREFIX}"
TIMEOUT = 900  # seconds any one command may take before the benchmark gives up on it


@dataclass
class Row:
    name: str
    wall: list[float] = field(default_factory=list)
    finish: list[float] = field(default_factory=list)  # the finishing run's share of `wall`
    fetched: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)  # peak RSS of the largest process of the run
    fetch: list[float] = field(default_factory=list)  # --fetch-only: the fetch phase's own seconds
    read: list[int] = field(default_factory=list)  # --fetch-only: the bytes the fetch phase read
    cpu: list[float] = field(default_factory=list)  # converter CPU seconds (sweep)
    proxy_cpu: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    note: str = ""


class Proxy:
    """One proxy process: its URL, counters, CPU time; killed with its process group."""

    def __init__(self, upstream: int, ckpt: Path, node_mbps: float, mbps: float, latency_ms: float) -> None:
        self.proc = subprocess.Popen(
            [
                PY,
                str(REPO / "tests/remote/proxy.py"),
                "--upstream",
                str(upstream),
                "--node-mbps",
                str(node_mbps),
                "--mbps",
                str(mbps),
                "--latency-ms",
                str(latency_ms),
                "--serve-from",
                f"/{BUCKET}/{PREFIX}={ckpt}",
            ],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://"), self.url

    def stats(self, reset: bool = False) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.url}/__proxy__/{'reset' if reset else 'stats'}", timeout=30) as r:
            doc: dict[str, int] = json.loads(r.read())
        return doc

    def cpu(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return float(t.user + t.system)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def sampler(pid: int) -> Any:
    from inspector.system.rss import MemorySampler

    return MemorySampler(pid=pid, interval=0.02).start()


def popen(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
    )


def finish(proc: subprocess.Popen[bytes], what: str) -> str:
    """Wait for `proc` (killed with its group after TIMEOUT); its output; exit on failure."""
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise SystemExit(f"{what}: no answer in {TIMEOUT} s") from None
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{out.decode()[-3000:]}")
    return out.decode()


def convert(out: Path, extra: list[str]) -> list[str]:
    return [PY, "-m", "inspector", "convert", URL, str(out), *extra]


def counters(proxies: list[Proxy]) -> tuple[int, int]:
    got = [p.stats() for p in proxies]
    return sum(g["bytes_out"] for g in got), sum(g["requests"] for g in got)


def one_run(
    row: Row, out: Path, env: dict[str, str], extra: list[str], proxies: list[Proxy], fetch_only: bool = False
) -> None:
    for p in proxies:
        p.stats(reset=True)
    shutil.rmtree(out, ignore_errors=True)
    pcpu = sum(p.cpu() for p in proxies)
    start = time.monotonic()
    cmd = [PY, str(HERE / "fetch_plan.py"), URL] if fetch_only else convert(out, extra)
    proc = popen(cmd, env)
    s = sampler(proc.pid)
    said = finish(proc, row.name)
    if fetch_only:
        doc = json.loads(said.strip().splitlines()[-1])
        row.fetch.append(float(doc["seconds"]))
        row.read.append(int(doc["bytes"]))
    wall = time.monotonic() - start
    row.rss.append(s.stop())
    row.wall.append(wall)
    fetched, requests = counters(proxies)
    row.fetched.append(fetched)
    row.requests.append(requests)
    row.proxy_cpu.append(sum(p.cpu() for p in proxies) - pcpu)
    row.load.append(os.getloadavg()[0])


def parts_run(
    row: Row, out: Path, base: dict[str, str], extra: list[str], head: Proxy, nodes: list[Proxy], n: int
) -> None:
    for p in [head, *nodes]:
        p.stats(reset=True)
    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    procs = [
        popen(convert(out, [*extra, "--part", f"{i}/{n}"]), dict(base, AWS_ENDPOINT_URL=nodes[i].url))
        for i in range(n)
    ]
    samplers = [sampler(p.pid) for p in procs]
    for i, p in enumerate(procs):
        finish(p, f"{row.name}: part {i}")
    peaks = [s.stop() for s in samplers]
    mid = time.monotonic()
    proc = popen(convert(out, extra), dict(base, AWS_ENDPOINT_URL=head.url))
    s = sampler(proc.pid)
    finish(proc, f"{row.name}: finishing run")
    end = time.monotonic()
    peaks.append(s.stop())
    row.wall.append(end - start)
    row.finish.append(end - mid)
    row.rss.append(max(peaks))
    fetched, requests = counters([head, *nodes])
    row.fetched.append(fetched)
    row.requests.append(requests)
    row.load.append(os.getloadavg()[0])
    served = [p.stats()["bytes_out"] for p in nodes[:n]]
    assert all(served), f"a node's proxy served nothing: {served}"


@contextmanager
def ray_cluster(n: int, nodes: list[Proxy], creds: dict[str, str]) -> Iterator[Any]:
    """A head that runs no task and `n` one-CPU nodes, node i started with AWS_ENDPOINT_URL=proxy i."""
    from ray.cluster_utils import Cluster

    saved = dict(os.environ)
    os.environ.update(creds)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for i in range(n):
            os.environ["AWS_ENDPOINT_URL"] = nodes[i].url
            c.add_node(num_cpus=1)
        c.wait_for_nodes()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        _warm(c.address, n)
        yield c
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def _warm(address: str, n: int) -> None:
    """Until n SPREAD tasks land on n nodes, and each node reports the endpoint it was started with."""
    import ray

    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    try:

        @ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
        def where() -> tuple[str, str]:
            time.sleep(0.3)
            return str(ray.get_runtime_context().get_node_id()), os.environ.get("AWS_ENDPOINT_URL", "")

        deadline = time.monotonic() + 300
        while True:
            got = ray.get([where.remote() for _ in range(n)])
            if len({g[0] for g in got}) == n and len({g[1] for g in got}) == n:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"the {n} Ray nodes never all took a task: {got}")
    finally:
        ray.shutdown()


class RaySampler:
    """Peak RSS of every process that ran a part (`ray::_run_part` in its title), sampled every 50 ms."""

    def __init__(self) -> None:
        self.peak: dict[int, int] = {}
        self.parts: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        import psutil

        while not self._stop.is_set():
            for proc in psutil.process_iter(["pid", "cmdline", "memory_info"]):
                cmd = proc.info.get("cmdline") or []
                if cmd and cmd[0].startswith("ray::"):
                    pid, mem = proc.info["pid"], proc.info.get("memory_info")
                    if mem is not None:
                        self.peak[pid] = max(self.peak.get(pid, 0), mem.rss)
                    if "_run_part" in cmd[0]:
                        self.parts.add(pid)
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max((self.peak.get(p, 0) for p in self.parts), default=0)


def ray_run(
    row: Row,
    out: Path,
    base: dict[str, str],
    extra: list[str],
    head: Proxy,
    nodes: list[Proxy],
    c: Any,
    n: int,
) -> None:
    for p in [head, *nodes]:
        p.stats(reset=True)
    shutil.rmtree(out, ignore_errors=True)
    env = dict(base, AWS_ENDPOINT_URL=head.url, ZI_RAY_AWS_ENV="node")
    rs = RaySampler()
    start = time.monotonic()
    proc = popen(
        convert(out, [*extra, "--executor", "ray", "--ray-address", c.address, "--parts", str(n)]), env
    )
    s = sampler(proc.pid)
    text = finish(proc, row.name)
    wall = time.monotonic() - start
    driver = s.stop()
    task = rs.stop()
    row.wall.append(wall)
    row.rss.append(max(driver, task))
    fetched, requests = counters([head, *nodes])
    row.fetched.append(fetched)
    row.requests.append(requests)
    row.load.append(os.getloadavg()[0])
    summary = next((line for line in text.splitlines() if line.startswith("Ray:")), "")
    row.note = f"driver {driver / MiB:.0f} MiB, task {task / MiB:.0f} MiB; {summary}"
    served = [p.stats()["bytes_out"] for p in nodes[:n]]
    assert all(served), (
        f"a Ray node's proxy served nothing (tasks not spread, or the endpoint not the node's): {served}"
    )


def same(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()), (a, b)
    assert all(filecmp.cmp(a / x, b / x, shallow=False) for x in names), (a, b)


def med(xs: list[float] | list[int]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="50M")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--shard-size", default="4MB")
    ap.add_argument("--node-mbps", type=float, default=10.0, help="each node's cap, MB/s (10^6 bytes)")
    ap.add_argument("--mbps", type=float, default=0.0, help="cap per connection, MB/s (0: none)")
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--parts", default="2,4", help="N for --part runs ('' for none)")
    ap.add_argument("--ray", default="2,4", help="N for Ray runs ('' for none)")
    ap.add_argument("--sweep", default="", help="requests in flight to measure one process at, e.g. 1,8,16")
    ap.add_argument(
        "--fetch-only",
        action="store_true",
        help="with --sweep: time only the fetch phase of the plan's reads (tests/benchmarks/fetch_plan.py)",
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/zi-scaleout-bench")
    args = ap.parse_args()
    from tests.remote.moto_s3 import moto_s3, upload_folder

    work = Path(args.workdir)
    ckpt = work / f"demo-{args.params}"
    creds = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    base = dict(os.environ, PYTHONPATH=str(REPO), **creds)
    base.pop("AWS_ENDPOINT_URL", None)
    if not (ckpt / "latest").exists():
        subprocess.run(
            [PY, "-m", "inspector", "demo", str(ckpt), "--params", args.params], check=True, env=base
        )
    extra = ["--dtype", args.dtype, "--shard-size", args.shard_size]
    pre = json.loads(
        subprocess.run(
            [PY, "-m", "inspector", "preflight", str(ckpt), *extra, "--json"],
            check=True,
            capture_output=True,
            env=base,
        ).stdout
    )
    need = int(pre["read_bytes"])
    on_disk = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())

    with moto_s3("bench", "bench") as (port, direct):
        upload_folder(direct, ckpt, BUCKET, PREFIX)

        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
        print(
            f"Machine: {platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start; "
            f"commit {commit}. Demo {args.params} (ZeRO-2, 2 ranks), {on_disk / MiB:,.0f} MiB on disk; the "
            f"{args.dtype} plan reads {need / MiB:,.1f} MiB and writes {pre['output_bytes'] / MiB:,.1f} MiB "
            f"(--shard-size {args.shard_size}).",
            flush=True,
        )
        rows: list[Row] = []
        proxies: list[Proxy] = []
        try:
            if args.sweep:
                sweep(args, ckpt, port, base, extra, need, rows, proxies)
            else:
                scale(args, ckpt, port, base, extra, need, creds, rows, proxies)
        finally:
            for p in proxies:
                p.stop()


def sweep(
    args: Any,
    ckpt: Path,
    port: int,
    base: dict[str, str],
    extra: list[str],
    need: int,
    rows: list[Row],
    proxies: list[Proxy],
) -> None:
    """One process at each width, and unthrottled, through one proxy process; CPU seconds of both."""
    work = Path(args.workdir)
    capped = Proxy(port, ckpt, 0.0, args.mbps, args.latency_ms)
    free = Proxy(port, ckpt, 0.0, 0.0, 0.0)
    proxies += [capped, free]
    widths = [int(x) for x in args.sweep.split(",")]
    plan = [(f"{w} in flight", w, capped) for w in widths] + [("8 in flight, no cap, no latency", 8, free)]
    table = {name: Row(name) for name, _, _ in plan}
    for _ in range(args.runs):
        for name, w, proxy in plan:
            row = table[name]
            env = dict(base, AWS_ENDPOINT_URL=proxy.url, ZI_S3_INFLIGHT=str(w))
            before = os.times()
            one_run(row, work / "out-sweep", env, extra, [proxy], args.fetch_only)
            after = os.times()
            row.cpu.append(
                (after.children_user + after.children_system)
                - (before.children_user + before.children_system)
            )
            print(f"  {name}: {row.wall[-1]:.2f} s, load {row.load[-1]:.1f}", flush=True)
    rows += table.values()
    print(
        f"\nOne process, {args.mbps:g} MB/s per connection, {args.latency_ms:g} ms per request, the proxy in its "
        f"own process; median of {args.runs}.\n"
    )
    if args.fetch_only:
        print("| run | fetch phase | MB/s | × 1 in flight | process wall | proxy CPU s | fetched (× read) | requests | load |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        first = med(rows[0].fetch)
        for r in rows:
            f, read = med(r.fetch), med(r.read)
            print(
                f"| {r.name} | {f:.2f} s | {read / f / 1e6:.0f} | {first / f:.2f} | {med(r.wall):.2f} s | "
                f"{med(r.proxy_cpu):.1f} | {med(r.fetched) / MiB:,.1f} MiB ({med(r.fetched) / read:.3f}) | "
                f"{med(r.requests):.0f} | {min(r.load):.1f}–{max(r.load):.1f} |"
            )
        return
    print(
        "| run | wall | MB/s of needed bytes | × 1 in flight | converter CPU s | proxy CPU s | fetched (× needed) | requests | peak RSS | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    one = med(rows[0].wall)
    for r in rows:
        w = med(r.wall)
        print(
            f"| {r.name} | {w:.2f} s | {need / w / 1e6:.0f} | {one / w:.2f} | {med(r.cpu):.1f} | {med(r.proxy_cpu):.1f} | "
            f"{med(r.fetched) / MiB:,.1f} MiB ({med(r.fetched) / need:.3f}) | {med(r.requests):.0f} | "
            f"{med(r.rss) / MiB:.0f} MiB | {min(r.load):.1f}–{max(r.load):.1f} |"
        )


def scale(
    args: Any,
    ckpt: Path,
    port: int,
    base: dict[str, str],
    extra: list[str],
    need: int,
    creds: dict[str, str],
    rows: list[Row],
    proxies: list[Proxy],
) -> None:
    work = Path(args.workdir)
    parts = [int(x) for x in args.parts.split(",") if x]
    rays = [int(x) for x in args.ray.split(",") if x]
    nmax = max([1, *parts, *rays])
    head = Proxy(port, ckpt, args.node_mbps, args.mbps, args.latency_ms)
    nodes = [Proxy(port, ckpt, args.node_mbps, args.mbps, args.latency_ms) for _ in range(nmax)]
    proxies += [head, *nodes]
    single = Row("one process (one node's cap)")
    table = {n: Row(f"`--part i/{n}` × {n} at once + finishing run") for n in parts}
    ref = work / "out-one"
    for _ in range(args.runs):  # one, then each N, back to back, so each round shares its load
        one_run(single, ref, dict(base, AWS_ENDPOINT_URL=head.url), extra, [head])
        print(f"  one: {single.wall[-1]:.2f} s, load {single.load[-1]:.1f}", flush=True)
        for n in parts:
            out = work / f"out-parts-{n}"
            parts_run(table[n], out, base, extra, head, nodes, n)
            same(out, ref)
            print(
                f"  parts {n}: {table[n].wall[-1]:.2f} s (finish {table[n].finish[-1]:.2f}), load {table[n].load[-1]:.1f}",
                flush=True,
            )
    rows += [single, *table.values()]
    for n in rays:
        row = Row(f"`--executor ray`, {n} nodes")
        t0 = time.monotonic()
        with ray_cluster(n, nodes, creds) as c:
            up = time.monotonic() - t0
            for _ in range(args.runs):
                out = work / f"out-ray-{n}"
                ray_run(row, out, base, extra, head, nodes, c, n)
                same(out, ref)
                print(f"  ray {n}: {row.wall[-1]:.2f} s, load {row.load[-1]:.1f}; {row.note}", flush=True)
        row.note += f"; cluster start {up:.0f} s (not counted)"
        rows.append(row)
    t1 = med(single.wall)
    print(
        f"\nEach node capped at {args.node_mbps:g} MB/s (all its connections together), {args.latency_ms:g} ms per "
        f"request{f', {args.mbps:g} MB/s per connection' if args.mbps else ''}; median of {args.runs}.\n"
    )
    print(
        "| run | wall | of which finishing | × (one node ÷ N) | fetched (× needed) | requests | peak RSS (largest process) | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        n = (
            1
            if r is single
            else int(r.name.split("/")[-1].split("`")[0])
            if "part" in r.name
            else int(r.name.split(", ")[1].split()[0])
        )
        w = med(r.wall)
        print(
            f"| {r.name} | {w:.2f} s | {f'{med(r.finish):.2f} s' if r.finish else '–'} | {w / (t1 / n):.2f} | "
            f"{f'{(w - med(r.finish)) / (t1 / n):.2f}' if r.finish else '–'} | "
            f"{med(r.fetched) / MiB:,.1f} MiB ({med(r.fetched) / need:.3f}) | {med(r.requests):.0f} | "
            f"{med(r.rss) / MiB:.0f} MiB | {min(r.load):.1f}–{max(r.load):.1f} |"
        )
    for r in rows:
        if r.note:
            print(f"- {r.name}: {r.note}")


if __name__ == "__main__":
    main()
