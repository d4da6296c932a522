"""Hostile file system objects: `latest` and rank files that are links out of the checkpoint, FIFOs, folders
and sockets; paths that look like markup or emoji codes. Each must end in a clear message naming the file,
the documented exit code, no traceback, no hang and nothing of a foreign file's contents printed.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from inspector.demo.writer import DemoSpec
from inspector.errors import CorruptFileError
from inspector.format.zipreader import TorchZip

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPEC = DemoSpec(stage=2, world_size=3, dtype="bf16", params=50_000)
TAG = "global_step3"
MODEL = "mp_rank_00_model_states.pt"
OPTIM1 = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
SECRET = "root:x:0:0:SECRET_TOKEN=hunter2"
HANG_LIMIT = 60  # a FIFO used to block forever; any run that returns at all is fine


def clean(res: CliResult, rc: int, *needles: str) -> None:
    assert "Traceback" not in res.output, res.output
    assert res.rc == rc, res.output
    for n in needles:
        assert n in res.output, f"{n!r} not in:\n{res.output}"
    assert "SECRET_TOKEN" not in res.output and "hunter2" not in res.output


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "passwd"
    path.parent.mkdir()
    path.write_text(SECRET + "\n")
    return path


@pytest.mark.parametrize("how", ["symlink-out", "hardlink-text", "garbage", "binary", "huge"])
def test_latest_contents_are_never_echoed(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], secret: Path, how: str
) -> None:
    """`latest` linking outside the root, or holding anything but a plain tag name: refused, exit 2, and
    not a byte of it printed (issue 7.2: it printed the first 4 KB of /etc/passwd or /proc/self/environ)."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    latest = root / "latest"
    latest.unlink()
    if how == "symlink-out":
        latest.symlink_to(secret)
        needle = "outside the checkpoint"
    elif how == "hardlink-text":
        latest.write_text(SECRET)  # inside the root, but not a tag name
        needle = "does not hold a plain tag name"
    elif how == "garbage":
        latest.write_text("../../etc/SECRET_TOKEN=hunter2")
        needle = "does not hold a plain tag name"
    elif how == "binary":
        latest.write_bytes(b"\xff\xfe" + SECRET.encode())
        needle = "is not text"
    else:
        latest.write_text(TAG + " " * 5000 + SECRET)
        needle = "too large"
    for command in ("scan", "preflight"):
        clean(cli(command, root), 2, "Unsafe tag", needle, str(latest))


def test_latest_symlink_inside_the_root_is_followed(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """A link that stays inside the checkpoint is fine."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / "latest").rename(root / "latest.real")
    (root / "latest").symlink_to("latest.real")
    clean(cli("scan", root), 0, TAG)


def make_odd(path: Path, kind: str, tmp_path: Path) -> Iterator[None]:
    """Replace `path` by a FIFO, a folder, a socket or a link out of the checkpoint."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        short = Path("/tmp") / f"zi-{os.getpid()}-{id(path)}.sock"  # AF_UNIX paths are limited to ~100 bytes
        sock.bind(str(short))
        os.rename(short, path)
        yield
        sock.close()
        return
    elif kind == "link-out":
        outside = tmp_path / "outside.pt"
        outside.write_bytes(b"not read")
        path.symlink_to(outside)
    yield


ODD = {
    "fifo": "a FIFO",
    "directory": "is a folder, not a regular file",
    "socket": "a socket",
    "link-out": "outside the checkpoint",
}


@pytest.mark.parametrize("kind", list(ODD))
def test_odd_rank_file_is_a_finding(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], kind: str
) -> None:
    """A rank file that is not a regular file inside the checkpoint: an error finding naming it, exit 1 for
    scan, convert and preflight, no hang, nothing written (issue 7.3)."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    path = root / TAG / OPTIM1
    odd = make_odd(path, kind, tmp_path)
    next(odd)
    try:
        out = tmp_path / "out"
        res = cli("scan", root, timeout=HANG_LIMIT)
        clean(res, 1, str(path), ODD[kind])
        clean(cli("convert", root, out, timeout=HANG_LIMIT), 1, "error finding")
        assert not out.exists()
        clean(cli("preflight", root, timeout=HANG_LIMIT), 1, str(path), ODD[kind])
    finally:
        next(odd, None)


@pytest.mark.parametrize("kind", ["fifo", "directory", "link-out"])
def test_odd_model_file_is_refused(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], kind: str
) -> None:
    """The rank-0 model file (read first, essential): refused with its name, exit 1, no hang."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    path = root / TAG / MODEL
    odd = make_odd(path, kind, tmp_path)
    next(odd)
    clean(cli("scan", root, timeout=HANG_LIMIT), 1, str(path), ODD[kind])


def test_reader_refuses_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "x.pt"
    os.mkfifo(fifo)
    with pytest.raises(CorruptFileError, match="a FIFO"):
        TorchZip(fifo)


@pytest.mark.parametrize("name", ["ckpt:smile::x:", "ckpt[bold]x[/bold]", "ckpt:thumbs_up:[/]"])
def test_paths_are_printed_literally(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], name: str
) -> None:
    """Emoji codes and markup in paths come out as typed, in tables, findings and errors alike."""
    root = demo.copy(SPEC, tmp_path / name)
    (root / TAG / OPTIM1).unlink()  # a finding that names a path
    res = cli("scan", root)
    clean(res, 1, str(root), str(root / TAG))
    assert not any(ch in res.output for ch in "😄❌👍")
    out = tmp_path / (name + "-out")
    res = cli("convert", root, out)
    clean(res, 1, "error finding")
    res = cli("scan", tmp_path / (name + "-missing"))
    clean(res, 2, str(tmp_path / (name + "-missing")))
    assert not any(ch in res.output for ch in "😄❌👍")


def _crafted_names(root: Path, name: str, version: str) -> None:
    """Rename the demo's buffer to `name` and set the DeepSpeed version, in the model-states pickle."""
    import torch

    path = root / TAG / MODEL
    sd = torch.load(path, weights_only=True)
    sd["module"][name] = sd["module"].pop("model.tokens_seen")
    sd["buffer_names"] = [name if n == "model.tokens_seen" else n for n in sd["buffer_names"]]
    sd["ds_version"] = version
    torch.save(sd, path)


def test_markup_in_names_from_the_pickle_is_printed_as_text(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """Rich markup in a tensor name and in the DeepSpeed version stays text: `[bold]` is shown, not obeyed."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    _crafted_names(root, "model.[bold]x:x:", "[red]0.19")
    for args in ((), ("--tensors",)):  # exit 1: the changed version also reads as a mixed run (a finding)
        clean(cli("scan", root, *args), 1, "[red]0.19")
    assert "[bold]x" in cli("scan", root, "--tensors").stdout


@pytest.mark.parametrize(
    ("name", "version"),
    [("model.x\x1b]0;owned\x07:x:", "0.19.8"), ("model.tokens_seen2", "0.19\x1b[2J")],
)
def test_terminal_escapes_in_names_are_refused(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], name: str, version: str
) -> None:
    """A tensor name or DeepSpeed version holding ESC/BEL can only be crafted, and would reach the terminal
    (and become a safetensors key): every command refuses the checkpoint, naming the escape as `\\x1b`."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    _crafted_names(root, name, version)
    for args in (("scan", root), ("preflight", root), ("convert", root, tmp_path / "out")):
        res = cli(*args)
        clean(res, 1, "control characters", "\\x1b")
        assert "\x1b" not in res.output and "\x07" not in res.output
    assert not (tmp_path / "out").exists()


def test_unsafe_latest_does_not_block_an_explicit_tag(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], secret: Path
) -> None:
    """The refusal's hint says "or pass --tag": with --tag, `latest` is not read at all."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    (root / "latest").unlink()
    (root / "latest").symlink_to(secret)
    clean(cli("scan", root, "--tag", TAG), 0, TAG)


def _swap_for_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _no_hang(work: Callable[[], object], fifo: Path) -> BaseException | None:
    """Run `work` in a thread; if it blocks on the FIFO, open the FIFO's write end to free it, then fail."""
    import threading

    caught: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            caught.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG_LIMIT)
    if t.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # a reader is waiting, so this opens: it lets go
        os.close(fd)
        t.join(HANG_LIMIT)
        pytest.fail(f"the converter blocked opening the FIFO {fifo}")
    return caught[0] if caught else None


def test_convert_refuses_a_fifo_swapped_in_after_scan(tmp_path: Path, demo: DemoCache) -> None:
    """A rank file replaced by a FIFO between scan and convert: refused with its name, never a hang."""
    from inspector.convert.options import ConvertOptions
    from inspector.convert.plan import build_plan
    from inspector.scan.scanner import scan
    from tests.convert.jobs import execute

    root = demo.copy(SPEC, tmp_path / "ckpt")
    plan = build_plan(scan(str(root)), ConvertOptions(dtype="fp32"))
    fifo = root / TAG / OPTIM1
    _swap_for_fifo(fifo)
    err = _no_hang(lambda: execute(plan, str(tmp_path / "out")), fifo)
    assert isinstance(err, CorruptFileError) and str(fifo) in str(err) and "a FIFO" in str(err), err
    assert not (tmp_path / "out").exists()


def test_universal_convert_refuses_a_fifo_swapped_in_after_scan(tmp_path: Path, demo: DemoCache) -> None:
    """The universal writer reads rank 0's optimizer state and every rank's partitions the same way."""
    from inspector.convert.kinds.universal.plan import plan_universal
    from inspector.scan.scanner import scan
    from tests.convert.jobs import universal as write_universal

    for victim in ("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", OPTIM1):
        root = demo.copy(SPEC, tmp_path / victim / "ckpt")
        plan = plan_universal(scan(str(root)), str(tmp_path / victim / "out"))
        fifo = root / TAG / victim
        _swap_for_fifo(fifo)
        err = _no_hang(functools.partial(write_universal, plan), fifo)
        assert isinstance(err, CorruptFileError) and str(fifo) in str(err) and "a FIFO" in str(err), err
