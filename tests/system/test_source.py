"""The confined source: links and `..` out of the root, non-regular files and oversized small files are
refused before anything is read, and no message carries the content or a link's target."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inspector.errors import CorruptFileError
from inspector.system.source import Source

SECRET = "AWS_SECRET_ACCESS_KEY=hunter2"


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Source, Path, Path]:
    root = tmp_path / "ckpt"
    (root / "tag").mkdir(parents=True)
    (root / "tag" / "ok.txt").write_text("global_step3")
    outside = tmp_path / "secret.txt"
    outside.write_text(SECRET)
    return Source.at(root), root, outside


def test_reads_a_regular_file_inside(tree: tuple[Source, Path, Path]) -> None:
    src, root, _ = tree
    assert src.read_bytes(root / "tag" / "ok.txt", 100) == b"global_step3"
    assert src.read_bytes("tag/ok.txt", 100) == b"global_step3"
    assert src.listdir("tag") == ["ok.txt"]
    assert src.kind("tag") == "dir" and src.kind("tag/ok.txt") == "file" and src.kind("nope") == "missing"


def test_link_inside_the_root_is_followed(tree: tuple[Source, Path, Path]) -> None:
    src, root, _ = tree
    (root / "alias.txt").symlink_to(root / "tag" / "ok.txt")
    (root / "tagalias").symlink_to(root / "tag")
    assert src.read_bytes("alias.txt", 100) == b"global_step3"
    assert src.read_bytes("tagalias/ok.txt", 100) == b"global_step3"


@pytest.mark.parametrize("how", ["file-link", "dir-link", "dotdot", "absolute"])
def test_paths_leaving_the_root_are_refused_without_echo(tree: tuple[Source, Path, Path], how: str) -> None:
    src, root, outside = tree
    if how == "file-link":
        (root / "tag" / "latest").symlink_to(outside)
        path: str | Path = root / "tag" / "latest"
    elif how == "dir-link":
        (root / "tag" / "up").symlink_to(outside.parent)
        path = "tag/up/secret.txt"
    elif how == "dotdot":
        path = "tag/../../secret.txt"
    else:
        path = outside
    assert src.kind(path) == "outside"
    with pytest.raises(CorruptFileError) as err:
        src.read_bytes(path, 100)
    text = str(err.value)
    assert "outside" in text and SECRET not in text and "hunter2" not in text
    assert str(outside) not in text or how == "absolute"  # a link's target is never shown


def test_fifo_is_refused_without_blocking(tree: tuple[Source, Path, Path]) -> None:
    src, root, _ = tree
    os.mkfifo(root / "tag" / "pipe")
    assert src.kind("tag/pipe") == "other"
    with pytest.raises(CorruptFileError, match="FIFO"):
        src.open("tag/pipe")


def test_oversized_small_file_is_refused(tree: tuple[Source, Path, Path]) -> None:
    src, root, _ = tree
    (root / "big.json").write_text("[" + "1," * 1000 + "1]")
    with pytest.raises(CorruptFileError, match="too large"):
        src.read_json("big.json", 100)


def test_json_errors_name_the_position_not_the_text(tree: tuple[Source, Path, Path]) -> None:
    src, root, _ = tree
    (root / "bad.json").write_text('{"token": "' + SECRET + '"')
    with pytest.raises(CorruptFileError) as err:
        src.read_json("bad.json", 10_000)
    assert SECRET not in str(err.value) and "line 1" in str(err.value)
    (root / "nan.json").write_text('{"x": NaN}')
    with pytest.raises(CorruptFileError):
        src.read_json("nan.json", 10_000)


def test_control_characters_in_paths_are_escaped(tree: tuple[Source, Path, Path]) -> None:
    src, _root, _ = tree
    with pytest.raises(CorruptFileError) as err:
        src.read_bytes("tag/\x1b]2;pwned\x07", 10)
    assert "\x1b" not in str(err.value) and "\\x1b" in str(err.value)


def test_tree_questions_are_the_sources_own(tree: tuple[Source, Path, Path], tmp_path: Path) -> None:
    """`locate` asks the source it was given: the local answers are the os calls it always made (links
    followed, a root's parent reachable), while opening stays confined."""
    src, root, outside = tree
    (root / "out").symlink_to(outside)
    (root / "gone").symlink_to(tmp_path / "nothing")
    assert not src.remote
    assert src.entry(str(root / "tag")) == "dir" and src.entry("tag/ok.txt") == "file"
    assert src.entry(str(root / "out")) == "file"  # followed, as locate expects; opening it is refused
    assert src.kind(str(root / "out")) == "outside"
    assert src.entry(str(root / "gone")) == "missing" and src.lexists(str(root / "gone"))
    assert src.entry(str(tmp_path)) == "dir"  # a tag folder's parent: locate looks at it
    assert sorted(src.names_in(str(root))) == ["gone", "out", "tag"]
    assert src.subdirs(str(root)) == ["tag"]
    assert src.size_and_mtime("tag/ok.txt")[0] == len("global_step3")
    with pytest.raises(OSError):
        src.names_in(str(root / "missing"))
    with pytest.raises(OSError):
        src.size_and_mtime(str(root / "gone"))
    parent = src.rooted(str(tmp_path), "checkpoint")
    assert isinstance(parent, Source) and parent.root == os.path.realpath(tmp_path)
    assert src.absolute("~") == os.path.expanduser("~")
