"""The pure parts of a bucket output (no store needed): part sizes, what stays local, the staging folder, the
preflight a bucket job answers with, and the options it refuses."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inspector.convert.bucket import BucketJob, plan_output, staging_for
from inspector.convert.kinds import Request, get
from inspector.convert.options import ConvertOptions
from inspector.convert.root import local_only
from inspector.demo.writer import DemoSpec
from inspector.errors import InspectorError
from inspector.remote.upload import MAX_PARTS, PART, part_size
from inspector.scan.scanner import scan

DEMO = DemoSpec(stage=2, world_size=2, dtype="bf16", params=60_000)


def test_parts_are_16_mib_until_a_file_would_need_more_than_s3_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert part_size(1) == part_size(5 * PART) == PART
    huge = 2 * PART * MAX_PARTS  # 320 GiB: twice what 10,000 parts of 16 MiB hold
    assert part_size(huge) == 2 * PART and -(-huge // part_size(huge)) <= MAX_PARTS
    assert part_size(huge + 1) % (1 << 20) == 0 and -(-(huge + 1) // part_size(huge + 1)) <= MAX_PARTS
    monkeypatch.setenv("ZI_S3_PART_MIB", "1")  # below S3's smallest part: raised to 5 MiB
    assert part_size(1) == 5 << 20


@pytest.mark.parametrize(
    ("rel", "local"),
    [
        ("model.safetensors", False),
        ("global_step3_uni/zero/l1.weight/fp32.pt", False),
        ("latest_universal", False),
        ("model.safetensors.partial", True),
        ("config.json.tmp", True),
        (".zero-inspector-journal.jsonl", True),
        (".zero-inspector-journal.jsonl.part-0-of-2", True),
        (".zero-inspector.lock", True),
        ("global_step3_uni.partial/zero/x/fp32.pt", True),
    ],
)
def test_only_output_files_are_published(rel: str, local: bool) -> None:
    assert local_only(rel) is local


def test_each_destination_stages_in_a_folder_of_its_own(tmp_path: Path) -> None:
    a, b = staging_for("s3://b/run/a", str(tmp_path)), staging_for("s3://b/run/b", str(tmp_path))
    assert a != b and Path(a).parent == Path(b).parent == tmp_path
    assert staging_for("s3://b/run/a", str(tmp_path)) == a  # a rerun finds (and clears) the same one


def test_a_bucket_job_reads_as_its_url_and_needs_disk_for_one_file(demo: Any, tmp_path: Path) -> None:
    ckpt = scan(str(demo(DEMO)))
    opts = ConvertOptions(shard_size=100_000, workers=1)  # one shard at a time (more: two side by side)
    job = plan_output(get("weights"), ckpt, Request(opts), "s3://bucket/run/out/", str(tmp_path))
    assert isinstance(job, BucketJob)
    assert job.where == job.out_dir == "s3://bucket/run/out"
    assert job.public(job.staging + "/model.safetensors") == "s3://bucket/run/out/model.safetensors"
    assert len(job.files) >= 3
    verdict = job.assess(free_disk=1 << 40)
    assert verdict.upload_to == "s3://bucket/run/out" and verdict.output_bytes == job.output_bytes
    assert verdict.staged_bytes == max(f.nbytes for f in job.files) < verdict.output_bytes
    assert verdict.disk_need == verdict.staged_bytes
    two = plan_output(get("weights"), ckpt, Request(replace(opts, workers=4)), "s3://bucket/x", str(tmp_path))
    sizes = sorted((f.nbytes for f in two.files), reverse=True)
    assert two.assess(free_disk=1 << 40).staged_bytes == sizes[0] + sizes[1]  # two shards staged at once
    tight = job.assess(free_disk=verdict.staged_bytes - 1)
    assert not tight.fits_disk and "staging" in tight.problem and "--staging" in tight.advice
    local = plan_output(get("weights"), ckpt, Request(opts), str(tmp_path / "out"))
    assert not isinstance(local, BucketJob)
    assert local.assess(free_disk=1 << 40).predicted_peak_rss < verdict.predicted_peak_rss  # upload buffers


def test_options_a_bucket_output_cannot_take_are_refused(demo: Any, tmp_path: Path) -> None:
    ckpt = scan(str(demo(DEMO)))
    with pytest.raises(InspectorError, match="--staging is for an s3:// output"):
        plan_output(get("weights"), ckpt, Request(), str(tmp_path / "out"), str(tmp_path))
    job = plan_output(get("weights"), ckpt, Request(), "s3://bucket/run/out", str(tmp_path))
    with pytest.raises(InspectorError, match="planned for part None run as part"):  # plan_output names it
        next(iter(job.run(part=(0, 2))))


def test_parts_stage_apart_and_the_finishing_run_waits_for_them(demo: Any, tmp_path: Path) -> None:
    """N parts on one machine: a staging folder and a lock each (no collision); the finishing run is refused
    while a part holds its lock, a part while the finishing run holds its. No bucket needed: the locks come
    before the store is asked anything."""
    from inspector.convert.root import LOCK, OutputRoot

    ckpt = scan(str(demo(DEMO)))
    url = "s3://bucket/run/out"
    jobs = [plan_output(get("weights"), ckpt, Request(), url, str(tmp_path), (i, 3)) for i in range(3)]
    finish = plan_output(get("weights"), ckpt, Request(), url, str(tmp_path))
    assert all(isinstance(j, BucketJob) for j in (*jobs, finish))
    stagings = {j.staging for j in jobs} | {finish.staging}
    assert len(stagings) == 4 and jobs[1].staging == finish.staging + ".part-1-of-3"
    assert len({j.identity for j in (*jobs, finish)}) == 1  # one job: the parts' objects are the finish's
    base, name = os.path.split(finish.staging)
    held = OutputRoot(base, lock_name=f"{LOCK}.{name}.part-1-of-3")  # as part 1 holds it while it runs
    try:
        with pytest.raises(InspectorError, match="Another conversion on this machine is writing to s3://"):
            next(iter(finish.run()))
    finally:
        held.release(ok=True)
    held = OutputRoot(base, lock_name=f"{LOCK}.{name}")  # the finishing run
    try:
        with pytest.raises(InspectorError, match="Another conversion on this machine is writing to s3://"):
            next(iter(jobs[0].run(part=(0, 3))))
    finally:
        held.release(ok=True)


def test_a_second_run_to_the_same_url_on_this_machine_is_refused(demo: Any, tmp_path: Path) -> None:
    """The staging folder's lock is taken before the store is asked anything: no bucket needed here."""
    from inspector.convert.root import LOCK, OutputRoot

    ckpt = scan(str(demo(DEMO)))
    job = plan_output(get("weights"), ckpt, Request(), "s3://bucket/run/out", str(tmp_path))
    assert isinstance(job, BucketJob)
    base, name = os.path.split(job.staging)
    held = OutputRoot(base, lock_name=f"{LOCK}.{name}")  # as the first run holds it
    try:
        with pytest.raises(InspectorError, match="Another conversion on this machine is writing to s3://"):
            next(iter(job.run()))
    finally:
        held.release(ok=True)


def test_preflight_for_a_bucket_names_it_and_the_staging_need(demo: Any, cli: Any, tmp_path: Path) -> None:
    """No store is asked: the figures come from the plan (what goes up) and the staging folder's disk."""
    import json

    root = demo(DEMO)
    args = ("--format", "weights", "--shard-size", "100KB", "--json")
    remote = cli("preflight", root, "--out", "s3://bucket/run/out", "--staging", tmp_path, *args)
    here = cli("preflight", root, "--out", tmp_path / "out", *args)
    assert remote.rc == here.rc == 0, remote.output
    a, b = json.loads(remote.stdout), json.loads(here.stdout)
    assert a["out_dir"] == "s3://bucket/run/out" and a["staging_dir"].startswith(str(tmp_path))
    assert a["upload_bytes"] == a["output_bytes"] == b["output_bytes"]
    assert 0 < a["staging_bytes"] < a["upload_bytes"] and "staging_bytes" not in b
