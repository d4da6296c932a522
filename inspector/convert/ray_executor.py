"""`convert --executor ray`: the `--part I/N` shares of one job run as Ray tasks, then the driver finishes.

Ray schedules; we do not. Each task re-plans the same job on its node from what the user asked (the plan is
a pure function of the checkpoint's metadata, so every node computes the same one) and writes its
byte-balanced share of the output files into the shared OUT exactly as `--part I/N` does: under its own lock,
with its own journal. Progress flows back through one small actor the driver polls; cancel (Ctrl-C, SIGTERM)
interrupts the tasks, and each cleans up as a cancelled `--part` run of its kind does. When every task has
ended, the driver runs the job once more without a part: it reuses every file whose checksum matches, writes
what is missing (a lost task's share), the side files and the index, and alone publishes.

Needs `pip install 'zero-inspector[ray]'`, a running cluster (`--ray-address`, `RAY_ADDRESS`, or a local one
started for the run), the package importable on every node, and OUT and the checkpoint on storage every node
sees at the same path. A checkpoint in a bucket (`s3://`) needs no shared storage for its input: each task
opens its own store client from the URL, with the driver's AWS_* environment (endpoint, region,
credentials) handed to the tasks through Ray's runtime_env where the driver has one; ZI_RAY_AWS_ENV=node
leaves each node its own (a node-local endpoint or instance role).

OUT may be an `s3://` prefix too (the same environment reaches the tasks): each task stages its share in a
folder of its own on its node (the node's temporary folder, or `--staging DIR` there) and uploads it as
`--part` does; the driver finishes from the bucket's listing and metadata, and alone uploads the index.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from typing import Any

from inspector.convert.executor import Progress, Report
from inspector.convert.order import Order
from inspector.errors import CancelledError, InspectorError

POLL = 0.25  # seconds between progress polls of the driver


@dataclass(frozen=True)
class PartResult:
    """What one task did, for the driver's summary: on which node, how many bytes, in how long."""

    part: int
    node: str
    bytes_written: int
    seconds: float
    reused: int = 0  # files an earlier, interrupted run had finished and this task kept


def plan(spec: Order, part: tuple[int, int] | None = None) -> Any:
    """The job, planned where this runs (driver or task) from the order alone (`part`: the task's, which
    names a bucket output's staging folder)."""
    return spec.plan(part)[1]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InspectorError(
            "--executor ray needs Ray, which is not installed.",
            hint="pip install 'zero-inspector[ray]' (on the driver and on every node of the cluster).",
            title="Ray is not installed",
        ) from None
    return ray


def connect(address: str | None) -> Any:
    """Join the cluster at `address` (or RAY_ADDRESS); with neither, start a local one for this run."""
    ray = _ray()
    if not ray.is_initialized():
        try:
            ray.init(
                address=address or os.environ.get("RAY_ADDRESS") or None,
                log_to_driver=False,
                logging_level=logging.WARNING,  # not Ray's "Connecting to…" lines between our own
            )
        except ConnectionError as exc:
            raise InspectorError(
                f"Cannot reach the Ray cluster at {address or os.environ.get('RAY_ADDRESS')}: {exc}",
                hint="Start it (`ray start --head` on the head node) or pass its address with --ray-address.",
                title="No Ray cluster",
            ) from None
    return ray


# what a task needs to reach the same store as the driver: the AWS SDK's own variables and our read width
_STORE_ENV = ("AWS_", "ZI_S3_")


def store_env(*paths: str) -> dict[str, str]:
    """The driver's AWS_* and ZI_S3_* variables, for the tasks of a job that reads or writes a bucket: Ray
    starts its workers from the node's environment, not the driver's, so without them a task would look for
    another endpoint or no credentials. Nothing for a local checkpoint and OUT, or with ZI_RAY_AWS_ENV=node
    (the nodes' own environment then decides, e.g. a node-local endpoint). Passed to Ray only, never printed."""
    from inspector.system.bytesource import is_url

    if not any(is_url(p) for p in paths) or os.environ.get("ZI_RAY_AWS_ENV") == "node":
        return {}
    return {k: v for k, v in os.environ.items() if k.startswith(_STORE_ENV)}


def default_parts(ray: Any, files: int) -> int:
    """One task per CPU the cluster offers, never more tasks than output files."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, min(files, cpus))


def run_on_ray(
    spec: Order,
    *,
    parts: int | None = None,
    address: str | None = None,
    cancel: threading.Event | None = None,
    on_part: Any = None,
    job: Any = None,
) -> Iterator[Progress | Report]:
    """Run the job's parts as tasks, yield the driver's view of their progress, then finish and yield the
    Report. `job`: the spec's job where the caller has planned it already (else it is planned here).
    `on_part(PartResult)` is called as each task ends. Raises CancelledError when `cancel` is set or the
    driver is interrupted (the tasks are interrupted and clean up as the kind does on cancel)."""
    ray = connect(address)
    job = job or plan(spec)
    n = parts or default_parts(ray, len(job.files))
    sink = _sink_class(ray).remote(n)
    refs = _launch(ray, spec, n, sink)
    start = time.monotonic()
    reused = yield from _watch(ray, job, list(refs), n, sink, cancel or threading.Event(), on_part, start)
    # every part has ended: the driver alone finishes (reuses the parts' files by checksum) and publishes; its
    # report counts the whole run (the parts' files are this run's work, not files reused from an earlier one)
    for ev in job.run(overwrite=spec.overwrite, fsync=spec.fsync, part=None):
        if isinstance(ev, Report):
            ev = replace(ev, seconds=time.monotonic() - start, resumed_shards=reused)
        yield ev


def _launch(ray: Any, spec: Order, n: int, sink: Any) -> list[Any]:
    """Start the n part tasks; their references, in part order."""
    # SPREAD: the parts go to different nodes (their bandwidth is the point), not wherever a CPU frees first
    options: dict[str, Any] = {"num_cpus": 1, "max_retries": 0, "scheduling_strategy": "SPREAD"}
    if env := store_env(spec.path, spec.out):
        options["runtime_env"] = {"env_vars": env}
    task = ray.remote(_run_part).options(**options)
    return [task.remote(spec, (i, n), sink) for i in range(n)]


def _watch(
    ray: Any,
    job: Any,
    pending: list[Any],
    n: int,
    sink: Any,
    cancel: threading.Event,
    on_part: Any,
    start: float,
) -> Generator[Progress, None, int]:
    """The driver's view of the running tasks, until every one has ended; returns the files they reused.
    A cancel, a failed task or an interrupt cancels the tasks still pending."""
    total = job.output_bytes
    reused = 0
    ended = False
    try:
        while pending:
            if cancel.is_set():
                raise CancelledError(f"Cancelled: the {n} Ray tasks are stopped; {job.cancelled_words()}.")
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL)
            for ref in done:
                result = _result(ray, ref)
                reused += result.reused
                if on_part is not None:
                    on_part(result)
            written = sum(ray.get(sink.totals.remote()))
            finished = n - len(pending)
            yield Progress(
                min(written, total),
                total,
                "",
                f"{finished} of {n} parts done",
                finished,
                n,
                time.monotonic() - start,
            )
        ended = True
    finally:
        # cancelled, failed, interrupted (Ctrl-C lands wherever the driver is, also outside this generator,
        # which then closes it): no task may go on writing into OUT behind the user's back
        # Only the tasks still pending, and without force: a running task gets KeyboardInterrupt and leaves OUT
        # as a cancelled part does. (Force-cancelling a task that was completing at that moment aborted the
        # driver inside Ray 2.60: "An unexpected system state has occurred", task_manager.cc.)
        if not ended:
            for ref in pending:
                ray.cancel(ref)
    return reused


def _result(ray: Any, ref: Any) -> PartResult:
    """A finished task's result; its failure as our error, in its own words where it has them."""
    try:
        result: PartResult = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None) or exc.as_instanceof_cause()
        if isinstance(cause, InspectorError):  # the task's own error (its class keeps its exit code)
            raise cause from None
        raise InspectorError(
            f"A Ray task failed: {type(cause).__name__}: {cause}",
            hint="The other parts' finished files are kept; run the same command again to redo the rest.",
            title="Conversion task failed",
        ) from None
    return result


def _run_part(spec: Order, part: tuple[int, int], sink: Any) -> PartResult:
    """One task: plan the same job, write part `part` into OUT, report bytes to the sink as they are written."""
    import ray

    from inspector.system.descriptors import raise_descriptor_limit
    from inspector.system.malloc import cap_malloc_arenas

    cap_malloc_arenas()  # the worker's reader threads start below; Ray's own threads keep their arenas
    raise_descriptor_limit()  # as the command line does: the task's pool holds every rank's file open
    start = time.monotonic()
    job = plan(spec, part)
    done = reused = 0
    last = 0.0
    for ev in job.run(overwrite=spec.overwrite, fsync=spec.fsync, part=part):
        if isinstance(ev, Progress):
            done = ev.bytes_done
            if time.monotonic() - last >= POLL:
                last = time.monotonic()
                sink.update.remote(part[0], done)
        elif isinstance(ev, Report):
            done, reused = ev.bytes_written, ev.resumed_shards
    sink.update.remote(part[0], done)
    node = ray.get_runtime_context().get_node_id()
    return PartResult(part[0], node, done, time.monotonic() - start, reused)


def _sink_class(ray: Any) -> Any:
    """An actor holding each part's bytes written: the tasks push, the driver polls."""

    class Sink:
        def __init__(self, n: int) -> None:
            self.done = [0] * n

        def update(self, i: int, nbytes: int) -> None:
            self.done[i] = nbytes

        def totals(self) -> list[int]:
            return self.done

    return ray.remote(num_cpus=0)(Sink)
