"""A bucket prefix answers the locating logic's tree questions itself, from its listings (fsspec's
`memory://`, in process: part of the quick run), as the local source answers them with the os calls."""

from __future__ import annotations

import pytest

from inspector.remote.source import StoreSource


@pytest.fixture(scope="module")
def bucket() -> StoreSource:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("memory://zi-tree/run/latest", b"global_step3")
    fs.pipe("memory://zi-tree/run/global_step3/mp_rank_00_model_states.pt", b"PK")
    fs.pipe("memory://zi-tree/run/\x1b[31mred", b"x")  # off the name rule: never an answer
    return StoreSource.at("memory://zi-tree/run/global_step3", "checkpoint")


def test_tree_questions_come_from_the_listings(bucket: StoreSource) -> None:
    assert bucket.remote
    run = "memory://zi-tree/run"
    assert bucket.entry(run) == "dir"  # the root's parent: locate looks at it
    assert bucket.entry(run + "/latest") == "file"
    assert bucket.entry(run + "/nothing") == "missing" and not bucket.lexists(run + "/nothing")
    assert sorted(bucket.names_in(run)) == ["global_step3", "latest"]
    assert bucket.subdirs(run) == ["global_step3"]
    assert bucket.size_and_mtime(run + "/latest")[0] == len(b"global_step3")
    with pytest.raises(OSError):
        bucket.names_in(run + "/latest")
    with pytest.raises(OSError):
        bucket.size_and_mtime(run + "/nothing")


def test_rooted_is_the_same_kind_at_another_root(bucket: StoreSource) -> None:
    parent = bucket.rooted("memory://zi-tree/run/", "checkpoint")
    assert isinstance(parent, StoreSource) and parent.root == "memory://zi-tree/run"
    assert parent.is_file("latest") and not bucket.contains("memory://zi-tree/run/latest")
    assert bucket.absolute("memory://zi-tree/run/") == "memory://zi-tree/run"
