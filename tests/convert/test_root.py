"""The output root: every path below OUT is reached without following a link, only plain names become paths,
nothing outside OUT is created, renamed or removed, and one run holds OUT at a time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inspector.convert.root import OutputRoot
from inspector.errors import OutputError
from inspector.system.source import Source


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder beside OUT that holds a user's file; no test may change it."""
    v = tmp_path / "victim"
    v.mkdir()
    (v / "exp_avg.pt").write_bytes(b"the user's")
    return v


def _untouched(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["exp_avg.pt"]
    assert (victim / "exp_avg.pt").read_bytes() == b"the user's"


@pytest.mark.parametrize(
    "name",
    ["../victim/exp_avg.pt", "a/../../victim/x", "..", "__metadata__", "a\x1b[2Jb", "x" * 300, "a\\b"],
)
def test_names_that_are_not_plain_are_refused(out: Path, victim: Path, name: str) -> None:
    with OutputRoot(str(out)) as root, pytest.raises(OutputError, match="Refusing to write"):
        root.write_atomic(name, b"data")
    _untouched(victim)


def test_a_link_inside_out_is_never_followed(out: Path, victim: Path) -> None:
    """A folder link and a file link planted in OUT (before or during a run): writes through them are refused,
    removals remove the link itself, and the target is untouched."""
    out.mkdir()
    (out / "zero").symlink_to(victim, target_is_directory=True)
    (out / "latest_universal").symlink_to(victim / "exp_avg.pt")
    with OutputRoot(str(out)) as root:
        with pytest.raises(OutputError, match="is a link or not a folder"):
            root.write_atomic("zero/exp_avg.pt", b"evil")
        with pytest.raises(OutputError, match="is a link"):
            fd = root.create("latest_universal")
            os.close(fd)
        root.write_atomic("latest_universal", b"ours")  # replaced by a rename: the link goes, not its target
        assert not (out / "latest_universal").is_symlink()
        root.remove_tree("zero")  # a link is removed as a link
        assert not (out / "zero").exists()
    _untouched(victim)


def test_remove_tree_does_not_descend_into_links(out: Path, victim: Path) -> None:
    with OutputRoot(str(out)) as root:
        root.write_atomic("stage/zero/a.pt", b"1")
        (out / "stage" / "zero" / "escape").symlink_to(victim, target_is_directory=True)
        root.remove_tree("stage")
    assert not (out / "stage").exists()
    _untouched(victim)


def test_copy_in_takes_only_regular_files_from_inside_their_source(
    tmp_path: Path, out: Path, victim: Path
) -> None:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "tokenizer.json").symlink_to(victim / "exp_avg.pt")  # a link out of the checkpoint
    os.mkfifo(src / "vocab.json")  # would block a plain open
    source = Source.at(str(src))
    with OutputRoot(str(out)) as root:
        assert root.copy_in(source, str(src / "config.json"), "config.json") == 2
        for name in ("tokenizer.json", "vocab.json"):
            with pytest.raises(Exception, match=r"link|FIFO|outside"):
                root.copy_in(source, str(src / name), name)
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # no half-copied file, no lock left
    _untouched(victim)


def test_one_run_holds_out_and_a_failed_run_removes_the_folders_it_made(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"
    first = OutputRoot(str(out))
    with pytest.raises(OutputError, match="Another conversion"):
        OutputRoot(str(out))
    first.write_atomic("x.tmp2", b"1")
    first.remove("x.tmp2")
    first.release(ok=False)
    assert not (tmp_path / "a").exists()  # the run made a/b/out, and nothing else was put there
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine").write_text("user")
    OutputRoot(str(kept / "out")).release(ok=False)
    assert sorted(p.name for p in kept.iterdir()) == ["mine"]


def test_write_with_leaves_nothing_when_the_writer_fails(out: Path) -> None:
    def fail(fh: object) -> None:
        raise RuntimeError("cancelled mid-file")

    with OutputRoot(str(out)) as root:
        with pytest.raises(RuntimeError):
            root.write_with("zero/w/fp32.pt", fail)
        assert list(root.walk_files("zero")) == []


def test_a_link_or_hard_link_at_the_temporary_name_is_never_written_through(out: Path, victim: Path) -> None:
    """write_with walks the folder once for its temporary file and its rename: a link planted at `NAME.tmp` is
    refused, and a hard link there is unlinked (its other name keeps the user's bytes)."""
    (out / "zero" / "w").mkdir(parents=True)
    (out / "zero" / "w" / "fp32.pt.tmp").symlink_to(victim / "exp_avg.pt")
    os.link(victim / "exp_avg.pt", out / "zero" / "w" / "exp_avg.pt.tmp")
    with OutputRoot(str(out)) as root:
        with pytest.raises(OutputError, match="is a link"):
            root.write_atomic("zero/w/fp32.pt", b"evil")
        assert root.write_atomic("zero/w/exp_avg.pt", b"ours") == 4
    assert (out / "zero" / "w" / "exp_avg.pt").read_bytes() == b"ours"
    _untouched(victim)


def test_sizes_and_remove_all_walk_each_folder_once_and_follow_no_link(out: Path, victim: Path) -> None:
    with OutputRoot(str(out)) as root:
        root.write_atomic("zero/a/fp32.pt", b"1234")
        root.write_atomic("zero/a/exp_avg.pt", b"12")
        root.write_atomic("zero/b/fp32.pt", b"1")
        (out / "zero" / "c").symlink_to(victim, target_is_directory=True)
        rels = ["zero/a/fp32.pt", "zero/b/fp32.pt", "zero/a/missing.pt", "zero/a/exp_avg.pt", "gone/x.pt"]
        walks: list[str] = []
        walk = root._parent
        root._parent = lambda rel, create: walks.append(rel) or walk(rel, create)  # type: ignore[method-assign]
        assert root.sizes(rels) == [4, 1, 0, 2, 0]
        assert len(walks) == 3  # zero/a, zero/b, gone
        root._parent = walk  # type: ignore[method-assign]
        with pytest.raises(OutputError, match="is a link or not a folder"):
            root.sizes(["zero/c/exp_avg.pt"])
        with pytest.raises(OutputError, match="is a link or not a folder"):
            root.remove_all(["zero/c/exp_avg.pt"])
        root.remove_all(["zero/a/fp32.pt", "zero/a/fp32.pt.tmp", "zero/b/fp32.pt", "gone/x.pt"])
        assert sorted(root.walk_files("zero")) == ["zero/a/exp_avg.pt"]
    _untouched(victim)


def test_walk_files_lists_regular_files_in_order_and_enters_no_link(out: Path, victim: Path) -> None:
    with OutputRoot(str(out)) as root:
        for rel in ("s/z/b.pt", "s/z/a.pt", "s/y/c.pt", "s/top.pt"):
            root.write_atomic(rel, b"x")
        (out / "s" / "z" / "escape").symlink_to(victim, target_is_directory=True)
        (out / "s" / "link.pt").symlink_to(victim / "exp_avg.pt")
        os.mkfifo(out / "s" / "fifo")
        assert list(root.walk_files("s")) == ["s/top.pt", "s/y/c.pt", "s/z/a.pt", "s/z/b.pt"]
    _untouched(victim)
