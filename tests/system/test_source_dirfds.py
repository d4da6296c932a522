"""The folder descriptors a source keeps during a batch of reads (`system/dirfds.py`): a file in a folder
already opened in costs one `openat`, while every refusal stays as it was (a link at any component, `..`, a
FIFO), the descriptors stay few and close when the batch ends, and no copy or forked child holds them."""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from inspector.errors import CorruptFileError
from inspector.scan.scanner import scan
from inspector.system import dirfds
from inspector.system.source import Source
from tests.scan.layout_cases import FIXTURES

SECRET = "AWS_SECRET_ACCESS_KEY=hunter2"


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Source, Path, Path]:
    root = tmp_path / "ckpt"
    (root / "tag").mkdir(parents=True)
    for r in range(4):
        (root / "tag" / f"rank_{r}.pt").write_bytes(b"x" * (r + 1))
    secret = tmp_path / "away" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    return Source.at(root), root, secret


def _opens(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every os.open from now on, as (name, dir_fd)."""
    seen: list[tuple[str, Any]] = []
    real = os.open

    def counting(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        seen.append((os.fspath(path), kwargs.get("dir_fd")))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    return seen


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_file_in_a_kept_folder_costs_one_open(tree: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    src, root, _ = tree
    seen = _opens(monkeypatch)
    with src.keeping():
        for r in range(4):
            h = src.open_handle(root / "tag" / f"rank_{r}.pt")
            assert h.size == r + 1 and h.pread(10, 0) == b"x" * (r + 1)
            h.close()
    names = [name for name, _ in seen]
    assert names.count(str(root)) == 1 and names.count("tag") == 1, names  # the walk, once
    assert [n for n in names if n.startswith("rank_")] == [f"rank_{r}.pt" for r in range(4)]
    assert len(seen) == 2 + 4
    before = _fds()
    seen.clear()
    assert src.read_bytes("tag/rank_0.pt", 10) == b"x" and len(seen) == 3  # outside a batch: walked, closed
    assert len(src._dirs) == 0 and _fds() == before


@pytest.mark.parametrize("link", ["file", "tag"])
def test_links_are_refused_with_the_folder_kept(tree: Any, link: str) -> None:
    """A symlinked rank file, or a symlinked tag folder, pointing out of the root: refused (and unread)
    within a batch, with every folder on the way already kept, and outside one."""
    src, root, secret = tree
    if link == "file":
        (root / "tag" / "rank_9.pt").symlink_to(secret)
    else:
        (root / "linked").symlink_to(secret.parent)
    path = "tag/rank_9.pt" if link == "file" else "linked/secret.txt"
    for batch in (src.keeping(), contextlib.nullcontext()):
        with batch:
            src.read_bytes("tag/rank_0.pt", 10)  # within a batch the tag folder is kept from here on
            for _ in range(2):  # the second time with every folder it walked kept
                with pytest.raises(CorruptFileError) as err:
                    src.read_bytes(path, 100)
                assert "outside" in str(err.value) and "hunter2" not in str(err.value)


def test_a_tag_folder_swapped_for_a_link_is_not_read_through(tree: Any) -> None:
    """The kept descriptor is the folder walked link-free; a link put in its place later leads nowhere
    (the old folder's files, or a missing file), and the next listing walks the path afresh and refuses it."""
    src, root, secret = tree
    with src.keeping():
        src.read_bytes("tag/rank_0.pt", 10)
        (root / "tag").rename(root / "old")
        (root / "tag").symlink_to(secret.parent)
        with pytest.raises(CorruptFileError) as err:
            src.read_bytes("tag/secret.txt", 100)
        assert "hunter2" not in str(err.value)
        with pytest.raises(CorruptFileError, match="outside"):
            src.listdir("tag")
    with pytest.raises(CorruptFileError, match="outside"):  # after the batch: walked, refused
        src.read_bytes("tag/secret.txt", 100)


def test_fifo_still_refused_in_a_kept_folder(tree: Any) -> None:
    src, root, _ = tree
    with src.keeping():
        src.read_bytes("tag/rank_0.pt", 10)
        os.mkfifo(root / "tag" / "pipe")
        with pytest.raises(CorruptFileError, match="FIFO"):
            src.read_bytes("tag/pipe", 10)


def test_a_listing_sees_a_replaced_folder(tree: Any) -> None:
    src, root, _ = tree
    with src.keeping():
        src.read_bytes("tag/rank_0.pt", 10)
        (root / "tag").rename(root / "old")
        (root / "tag").mkdir()
        (root / "tag" / "new.pt").write_bytes(b"new")
        assert src.listdir("tag") == ["new.pt"]
        assert src.read_bytes("tag/new.pt", 10) == b"new"


def test_descriptors_are_bounded_and_closed(tmp_path: Path) -> None:
    for d in range(dirfds.KEPT + 3):
        (tmp_path / f"d{d}").mkdir()
        (tmp_path / f"d{d}" / "f").write_bytes(b"f")
    before = _fds()
    src = Source.at(tmp_path)
    with src.keeping():
        for d in range(dirfds.KEPT + 3):
            assert src.read_bytes(f"d{d}/f", 10) == b"f"
        assert len(src._dirs) == dirfds.KEPT and _fds() == before + dirfds.KEPT
        with src.keeping():  # nested: the outer batch still keeps them
            src.read_bytes("d0/f", 10)
        assert len(src._dirs) == dirfds.KEPT
    assert len(src._dirs) == 0 and _fds() == before  # the batch ended
    for _ in range(3):  # outside a batch nothing stays open
        assert src.read_bytes("d1/f", 10) == b"f" and _fds() == before


def test_a_copy_or_a_forked_child_starts_without_descriptors(tree: Any) -> None:
    src, _, _ = tree
    with src.keeping():
        _copied_and_forked(src)


def _copied_and_forked(src: Source) -> None:
    src.read_bytes("tag/rank_0.pt", 10)
    assert len(src._dirs) == 1  # the tag folder
    for other in (pickle.loads(pickle.dumps(src)), copy.deepcopy(src)):
        assert other == src and len(other._dirs) == 0 and other.read_bytes("tag/rank_1.pt", 10) == b"xx"
    assert copy.copy(src)._dirs is src._dirs  # a shallow copy shares them (the lock guards their use)
    pid = os.fork()
    if pid == 0:  # the child: what it inherited is closed, and it still reads
        ok = len(src._dirs) == 0 and src.read_bytes("tag/rank_2.pt", 10) == b"xxx"
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert src.read_bytes("tag/rank_3.pt", 10) == b"xxxx"


def test_a_scan_opens_each_rank_file_once_without_a_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real 4-rank ZeRO-3 save: one `openat` per rank file, none of them walking from the root."""
    ckpt_dir = FIXTURES / "autoep_z3_bf16_ws4" / "ckpt"
    seen = _opens(monkeypatch)
    ckpt = scan(str(ckpt_dir))
    assert not ckpt.errors
    names = Counter(name for name, _ in seen)
    ranks = [n for n in names if n.endswith("_states.pt")]
    assert len(ranks) >= 8, names  # 4 optimizer + 4 model states files at least
    assert all(names[n] == 1 for n in ranks), names
    order = [name for name, _ in seen]
    optim = [i for i, n in enumerate(order) if n.endswith("_optim_states.pt")]
    assert len(optim) == 4 and optim == list(range(optim[0], optim[0] + 4)), order  # no walk between them


def test_a_scans_file_sizes_and_times_come_from_the_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FileInfo`'s size and save time: the fstat of the open the scan read each rank file through, equal to a
    stat's, with no stat of its own (only the rank-0 model states, which a claim loaded, is asked)."""
    ckpt_dir = FIXTURES / "autoep_z3_bf16_ws4" / "ckpt"
    asked: list[str] = []
    real = Source.size_and_mtime

    def counting(self: Source, path: str) -> tuple[int, int]:
        asked.append(os.path.basename(path))
        return real(self, path)

    monkeypatch.setattr(Source, "size_and_mtime", counting)
    ckpt = scan(str(ckpt_dir))
    assert not ckpt.errors and len(ckpt.files) >= 8
    for f in ckpt.files:
        st = os.stat(f.path)
        assert (f.size, f.mtime_ns) == (st.st_size, st.st_mtime_ns) and f.mtime_ns > 0, f.path
    assert asked == ["zero_pp_rank_0_mp_rank_00_model_states.pt"], asked


def test_a_file_pool_keeps_its_folders_from_its_first_open_to_its_close(
    tree: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's reads are one batch (`FilePool`): its files cost one `openat` each after the first walk, and
    the folders close with the pool, the source holding none after it (an app's checkpoint is held long)."""
    from inspector.convert.filepool import FilePool

    src, root, _ = tree
    before = _fds()
    seen = _opens(monkeypatch)
    with FilePool(src) as pool:
        assert len(src._dirs) == 0  # nothing opened yet: nothing held
        for r in range(4):
            view = memoryview(bytearray(r + 1))
            pool.read_into(str(root / "tag" / f"rank_{r}.pt"), 0, view)
            assert bytes(view) == b"x" * (r + 1)
        assert len(src._dirs) == 1
    names = [name for name, _ in seen]
    assert names.count(str(root)) == 1 and names.count("tag") == 1, names
    assert len(seen) == 2 + 4
    assert len(src._dirs) == 0 and _fds() == before
    with FilePool(src) as pool:  # a second pool walks afresh: nothing was left open between them
        pool.read_into(str(root / "tag" / "rank_0.pt"), 0, memoryview(bytearray(1)))
    assert [name for name, _ in seen].count("tag") == 2 and len(src._dirs) == 0
