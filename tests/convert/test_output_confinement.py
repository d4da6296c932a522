"""No write leaves OUT: links planted inside OUT under the names a conversion writes point outside, and the
conversion (with and without --overwrite) must leave what they point to untouched."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from inspector.demo.writer import DemoSpec

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPEC = DemoSpec(stage=2, world_size=2, dtype="bf16", params=50_000)
TAG = "global_step3"

# kind -> names a conversion into OUT writes (files and folders), each planted as a link to outside
PLANTED = {
    "weights": ("model.safetensors", "model.safetensors.partial", ".zero_inspector_journal.json"),
    "model": ("model.safetensors", "config.json"),
    "universal": ("latest_universal", f"{TAG}_uni", f".{TAG}_uni.partial"),
}


def _snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` with a digest of its bytes (links as their target)."""
    out: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


@pytest.mark.parametrize("kind", sorted(PLANTED))
@pytest.mark.parametrize("overwrite", [False, True])
def test_links_planted_in_out_are_never_followed(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], kind: str, overwrite: bool
) -> None:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "file").write_bytes(b"the user's own bytes\n")
    (outside / "dir" / "keep").write_bytes(b"keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    for name in PLANTED[kind]:
        target = outside / "dir" if name.endswith(("_uni", ".partial")) else outside / "file"
        (out / name).symlink_to(target)
    before = _snapshot(outside)
    res = cli("convert", demo(SPEC), out, "--format", kind, *(["--overwrite"] if overwrite else []))
    assert "Traceback" not in res.stderr
    assert _snapshot(outside) == before, res.stdout + res.stderr
    if res.rc != 0:  # refused: said why, naming no content
        assert res.rc in (1, 2) and res.stderr.strip()


def test_a_fifo_planted_as_the_journal_is_never_waited_on(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """The busy-folder check reads a previous run's journal before it takes OUT: a FIFO under that name would
    block an open() forever; the input boundary refuses it, so the run goes on (the FIFO is not ours to
    replace: the folder is not empty)."""
    import os

    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / ".zero-inspector-journal.json")
    res = cli("convert", demo(SPEC), out)
    assert res.rc in (0, 2), res.output  # it answers; it does not hang on the FIFO


def test_universal_verify_never_reads_a_linked_model_states_copy(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """A model-states copy in the universal folder replaced by a link to the original: verify refuses to
    follow it and reports the copy as not identical, instead of comparing the file with itself."""
    root = demo(DemoSpec(stage=3, world_size=2, dtype="bf16", params=50_000))
    assert cli("convert", root, tmp_path, "--format", "universal").rc == 0
    copy = next((tmp_path / f"{TAG}_uni").glob("*model_states.pt"))
    original = next((Path(root) / TAG).glob(copy.name))
    copy.unlink()
    copy.symlink_to(original)
    res = cli("verify", root, tmp_path)
    assert res.rc == 1 and copy.name in res.output, res.output


# bookkeeping and output names a weights conversion (whole, or one --part) opens for writing, each planted as
# a hard link to a file outside OUT: O_NOFOLLOW does not stop a hard link, so every write must make a new
# inode (create) or check the link count first (the lock, the journal's appends)
HARD_LINKED = (
    ".zero-inspector.lock",
    ".zero-inspector.lock.part-1-of-2",
    ".zero-inspector-journal.jsonl",
    ".zero-inspector-journal.jsonl.tmp",
    ".zero-inspector-journal.jsonl.part-1-of-2",
    ".zero-inspector-journal.jsonl.part-1-of-2.tmp",
    "model.safetensors",
    "model.safetensors.partial",
    "model.safetensors.tmp",
    "model.safetensors.index.json",
    "model.safetensors.index.json.tmp",
)


@pytest.mark.parametrize("name", HARD_LINKED)
@pytest.mark.parametrize("part", [False, True])
def test_hard_links_planted_in_out_are_never_written_through(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], name: str, part: bool
) -> None:
    import os

    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "file"
    victim.write_bytes(b"the user's own bytes\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(victim, out / name)
    before = _snapshot(outside)
    res = cli("convert", demo(SPEC), out, "--overwrite", *(["--part", "1/2"] if part else []))
    assert "Traceback" not in res.stderr
    assert _snapshot(outside) == before, res.stdout + res.stderr
    assert victim.stat().st_nlink in (1, 2)
    if res.rc != 0:  # refused before a byte went through the link: said why, naming the file
        assert res.rc in (1, 2) and "not a file this tool made" in res.stderr, res.stderr


def test_the_journal_appends_never_through_a_hard_link(tmp_path: Path) -> None:
    """The journal's line-by-line appends check the name's link count before each write."""
    import os

    from inspector.convert.root import OutputRoot
    from inspector.errors import OutputError

    victim = tmp_path / "victim"
    victim.write_bytes(b"mine\n")
    out = tmp_path / "out"
    out.mkdir()
    with OutputRoot(str(out)) as root:
        root.append("j.jsonl", b"one\n")
        os.link(victim, out / "k.jsonl")
        with pytest.raises(OutputError, match="not a file this tool made"):
            root.append("k.jsonl", b"two\n")
        os.mkfifo(out / "f.jsonl")
        with pytest.raises(OutputError, match="not a file this tool made"):
            root.append("f.jsonl", b"three\n")  # never waits on a FIFO either
    assert victim.read_bytes() == b"mine\n"
    assert (out / "j.jsonl").read_bytes() == b"one\n"
