"""A ConversionPlan run as a job by the one executor (what most engine tests need: the shards and the index)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from inspector.convert.executor import Progress, Report
from inspector.convert.executor import execute as _execute
from inspector.convert.executor import run as _run
from inspector.convert.kinds.safetensors import weights_job
from inspector.convert.plan import ConversionPlan


def run(plan: ConversionPlan, out_dir: str, **kw: Any) -> Iterator[Progress | Report]:
    return _run(weights_job(plan, out_dir), **kw)


def execute(plan: ConversionPlan, out_dir: str, **kw: Any) -> Report:
    return _execute(weights_job(plan, out_dir), **kw)


def universal_job(plan: Any, workers: int = 2) -> Any:
    """A universal plan as its kind's job (as the registry plans it)."""
    from inspector.convert.kinds.universal import UniversalJob

    return UniversalJob("universal", plan.out_root, plan, workers=workers)


def universal(plan: Any, workers: int = 2, **kw: Any) -> Report:
    """A universal plan written to completion."""
    return _execute(universal_job(plan, workers), **kw)


def journalled(path: Any) -> dict[str, Any]:
    """A journal's finished files and their checksums (its first line names the job)."""
    import json

    with open(path) as fh:
        lines = [json.loads(x) for x in fh.read().splitlines()[1:] if x.endswith("}")]
    return {"complete": [x["file"] for x in lines], "crc32": {x["file"]: x["crc32"] for x in lines}}
