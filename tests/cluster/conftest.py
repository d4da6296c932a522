"""One local Ray cluster of two nodes (`ray.cluster_utils.Cluster`, one CPU each) for every cluster test.

Its nodes start without any AWS_* variable, as nodes a driver reaches usually have none of its own: a job
that reads a bucket works only if the driver hands its environment to the tasks. Never `ray stop` (it kills
every Ray process of the machine by name): the cluster is shut down through the object that started it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as mp:  # the nodes (raylets, workers) inherit this environment
        for name in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(name)
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
    try:
        _warm(c.address)
        yield c
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def _warm(address: str) -> None:
    """Until a SPREAD pair of tasks lands on both nodes: `wait_for_nodes` returns when the second node has
    registered, before its workers can take a task, and the first test's parts then all ran on the head."""
    import ray

    ray.init(address=address, log_to_driver=False)
    try:

        @ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
        def where() -> str:
            time.sleep(0.2)
            return str(ray.get_runtime_context().get_node_id())

        deadline = time.monotonic() + 60
        while len(set(ray.get([where.remote(), where.remote()]))) < 2:
            assert time.monotonic() < deadline, "the second node never took a task"
    finally:
        ray.shutdown()
