"""Hostile and broken files: crafted pickles never run, damaged files fail with a clear message.

Crafted pickles are real torch zip archives with a malicious `data.pkl`. Every payload would create a
marker file; each test proves the payload is live (an unrestricted unpickler does create the marker) and
that neither the reader nor `scan` let it run. User-facing failures go through the CLI in a subprocess:
non-zero exit, a message naming the file and the problem, and never a Python traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import pickletools
import random
import shlex
import struct
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from inspector.demo.writer import DemoSpec
from inspector.errors import CorruptFileError, UnsafePickleError
from inspector.format.records import ZeroStage
from inspector.format.torchzip import load_tree
from inspector.format.zipreader import TorchZip
from inspector.scan.scanner import scan

if TYPE_CHECKING:
    from conftest import CliResult, DemoCache

SPEC = DemoSpec(stage=2, world_size=3, dtype="bf16", params=50_000)
TAG = "global_step3"
MODEL = "mp_rank_00_model_states.pt"


def optim_name(rank: int, prefix: str = "bf16_") -> str:
    return f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


# --- crafting pickles -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class G:
    """A global `module.name`: GLOBAL below protocol 4, STACK_GLOBAL from 4 on."""

    module: str
    name: str


@dataclass(eq=False)
class R:
    """`func(*args)` via REDUCE (memoized, so the same R can be referenced twice)."""

    func: Any
    args: tuple[Any, ...]


@dataclass(eq=False)
class Inst:
    """`cls(*args)` via INST (protocol 0) or OBJ (protocol 1)."""

    cls: G
    args: tuple[Any, ...]
    opcode: str = "inst"


@dataclass(eq=False)
class Build:
    """Push `obj`, push `state`, BUILD: the object's `__setstate__` (or attribute update) runs."""

    obj: Any
    state: Any


class HostilePickler(pickle._Pickler):  # type: ignore[name-defined, misc]  # mypy: pickle._Pickler is private
    """The pure-Python pickler, taught to emit arbitrary globals and raw REDUCE/INST/OBJ/BUILD."""

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def save_g(self, obj: G) -> None:
        if self.proto >= 4:
            self.save(obj.module)
            self.save(obj.name)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())

    def save_r(self, obj: R) -> None:
        self.save(obj.func)
        self.save(obj.args)
        self.write(pickle.REDUCE)
        self.memoize(obj)

    def save_inst(self, obj: Inst) -> None:
        self.write(pickle.MARK)
        if obj.opcode == "obj":
            self.save(obj.cls)
        for a in obj.args:
            self.save(a)
        if obj.opcode == "obj":
            self.write(pickle.OBJ)
        else:
            self.write(pickle.INST + f"{obj.cls.module}\n{obj.cls.name}\n".encode())
        self.memoize(obj)

    def save_build(self, obj: Build) -> None:
        self.save(obj.obj)
        self.save(obj.state)
        self.write(pickle.BUILD)

    dispatch[G] = save_g
    dispatch[R] = save_r
    dispatch[Inst] = save_inst
    dispatch[Build] = save_build


def dumps(tree: Any, protocol: int = 2) -> bytes:
    buf = io.BytesIO()
    HostilePickler(buf, protocol=protocol).dump(tree)
    return buf.getvalue()


def write_pt(path: Path, pkl: bytes, records: dict[str, bytes] | None = None) -> Path:
    """A torch-style zip (STORED) with the given data.pkl and storage records."""
    arc = path.name.removesuffix(".pt")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{arc}/data.pkl", pkl)
        z.writestr(f"{arc}/.format_version", "1")
        z.writestr(f"{arc}/byteorder", "little")
        for key, data in (records or {}).items():
            z.writestr(f"{arc}/data/{key}", data)
        z.writestr(f"{arc}/version", "3\n")
    return path


def replace_pkl(path: Path, edit: Callable[[bytes], bytes]) -> None:
    """Rewrite an archive in place with `edit(data.pkl)`; every other entry is copied unchanged."""
    with zipfile.ZipFile(path) as zin:
        entries = [(i.filename, zin.read(i.filename)) for i in zin.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
        for name, data in entries:
            zout.writestr(name, edit(data) if name.endswith("/data.pkl") else data)


def payload_ops(payload: Any) -> bytes:
    """Protocol-2 opcodes that push `payload` (no PROTO header, no STOP)."""
    body = dumps(payload, 2)
    assert body[:2] == b"\x80\x02" and body[-1:] == pickle.STOP
    return body[2:-1]


def append_item(pkl: bytes, key: str, payload: Any) -> bytes:
    """A root-dict pickle with `root[key] = payload` appended after everything else."""
    assert pkl.endswith(pickle.STOP)
    key_ops = pickle.BINUNICODE + struct.pack("<I", len(key.encode())) + key.encode()
    return pkl[:-1] + key_ops + payload_ops(payload) + pickle.SETITEM + pickle.STOP


def append_raw(pkl: bytes, key: str, ops: bytes) -> bytes:
    """Like append_item, with hand-written opcodes for the value."""
    key_ops = pickle.BINUNICODE + struct.pack("<I", len(key.encode())) + key.encode()
    return pkl[:-1] + key_ops + ops + pickle.SETITEM + pickle.STOP


def deep_list_ops(depth: int) -> bytes:
    """[[[[...]]]] nested `depth` levels: built iteratively by the unpickler, fatal to a recursive repr()."""
    return pickle.EMPTY_LIST * depth + pickle.APPEND * (depth - 1)


def shared_tree_ops(levels: int, memo_base: int = 1_000) -> bytes:
    """l0 = [], l(i+1) = [l(i), l(i)]: `levels` memo entries, but 2**levels leaves when walked naively."""
    ops = pickle.EMPTY_LIST + pickle.LONG_BINPUT + struct.pack("<I", memo_base)
    for i in range(levels):
        get = pickle.LONG_BINGET + struct.pack("<I", memo_base + i)
        ops += pickle.POP + pickle.EMPTY_LIST + pickle.MARK + get + get + pickle.APPENDS
        ops += pickle.LONG_BINPUT + struct.pack("<I", memo_base + i + 1)
    return ops  # leaves exactly the top list on the stack


class Unrestricted(pickle.Unpickler):
    """The control: a plain unpickler (persistent ids ignored) that *does* run payloads."""

    def persistent_load(self, pid: Any) -> None:
        return None


def assert_payload_is_live(pkl: bytes, marker: Path) -> None:
    """Unpickling without restrictions creates the marker, so its absence elsewhere means something."""
    assert not marker.exists()
    with contextlib.suppress(Exception):  # the payload ran first; its result may not fit the rest
        Unrestricted(io.BytesIO(pkl)).load()
    deadline = time.monotonic() + 10  # Popen runs `touch` asynchronously
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists(), "the control unpickler did not run the payload; the test proves nothing"
    marker.unlink()


def payloads(marker: Path) -> dict[str, tuple[Any, str]]:
    """name -> (object tree that creates `marker` when unpickled, the global our error must name)."""
    m = str(marker)
    touch = f"touch {shlex.quote(m)}"
    code = f"open({m!r}, 'w').close()"
    mod = R(G("importlib", "import_module"), ("os",))
    return {
        "os.system": (R(G("os", "system"), (touch,)), "os.system"),
        "posix.system": (R(G("posix", "system"), (touch,)), "posix.system"),
        "builtins.eval": (R(G("builtins", "eval"), (code,)), "builtins.eval"),
        "__builtin__.eval": (R(G("__builtin__", "eval"), (code,)), "eval"),
        "builtins.exec": (R(G("builtins", "exec"), (code,)), "builtins.exec"),
        "builtins.getattr": (
            R(R(G("builtins", "getattr"), (R(G("builtins", "__import__"), ("os",)), "system")), (touch,)),
            "builtins.getattr",
        ),
        "subprocess.Popen": (R(G("subprocess", "Popen"), (["touch", m],)), "subprocess.Popen"),
        "importlib.import_module": (
            [mod, R(R(G("builtins", "getattr"), (mod, "system")), (touch,))],
            "importlib.import_module",
        ),
    }


def nested(payload: Any) -> Any:
    """Bury a payload deep inside the kind of structure an optimizer file has."""
    inner = OrderedDict([("exp_avg", 1.0), ("deep", [{"x": (payload,)}])])
    return {
        "optimizer_state_dict": {"state": {0: [0, inner]}, "param_groups": [{"params": [0]}]},
        "ds_version": "0.19.8",
    }


def hostile_cases() -> list[tuple[str, str, int]]:
    """(payload name, delivery, protocol)."""
    cases = []
    for name in payloads(Path("/x")):
        cases.append((name, "GLOBAL", 2))
        if not name.startswith("__builtin__"):  # python-2 module names are only mapped below protocol 3
            cases.append((name, "STACK_GLOBAL", 4))
    for name in ("os.system", "builtins.eval", "subprocess.Popen"):
        cases.append((name, "INST", 0))
        cases.append((name, "OBJ", 1))
    return cases


def build_hostile(case: tuple[str, str, int], marker: Path) -> tuple[bytes, str]:
    """The crafted data.pkl for a case, and the global our error message must name."""
    name, delivery, protocol = case
    tree, refused = payloads(marker)[name]
    if delivery in ("INST", "OBJ"):
        assert isinstance(tree, R)
        tree = Inst(tree.func, tree.args, delivery.lower())
    pkl = dumps(nested(tree), protocol)
    ops = {op.name for op, _, _ in pickletools.genops(pkl)}
    assert ("STACK_GLOBAL" in ops) == (delivery == "STACK_GLOBAL")
    assert ("GLOBAL" in ops) == (delivery != "STACK_GLOBAL")
    return pkl, refused


def hostile_checkpoint(root: Path, pkl: bytes) -> Path:
    """A root whose rank-0 model file is the crafted pickle (scan loads it first)."""
    tag_dir = root / TAG
    tag_dir.mkdir(parents=True)
    write_pt(tag_dir / MODEL, pkl)
    write_pt(tag_dir / optim_name(0), pkl)
    (root / "latest").write_text(TAG)
    return root


def assert_clean_failure(res: CliResult, *needles: str, rc: int | None = None) -> None:
    """Non-zero exit (or exactly `rc`), every needle in the output, and no Python traceback."""
    assert "Traceback" not in res.output, res.output
    assert res.rc != 0, res.output
    if rc is not None:
        assert res.rc == rc, res.output
    for needle in needles:
        assert needle in res.output, f"{needle!r} not in:\n{res.output}"


def scan_json(cli: Callable[..., CliResult], root: Path, rc: int = 1) -> dict[str, Any]:
    """`scan --json` output, after checking the exit code and that nothing crashed."""
    res = cli("scan", root, "--json")
    assert "Traceback" not in res.output, res.output
    assert res.rc == rc, res.output
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def error_findings(doc: dict[str, Any], code: str) -> list[dict[str, Any]]:
    """The error findings with `code`; fails if there are none."""
    found = [f for f in doc["findings"] if f["severity"] == "error" and f["code"] == code]
    assert found, f"no {code!r} error among {doc['findings']}"
    return found


# --- crafted pickles: the reader ---------------------------------------------------------------------------------

CASES = hostile_cases()
CASE_IDS = [f"{n}-{d}" for n, d, _ in CASES]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_reader_refuses_payload(tmp_path: Path, case: tuple[str, str, int]) -> None:
    """load_tree refuses the global by name, nothing runs, and the payload is proven live afterwards."""
    marker = tmp_path / "PWNED"
    pkl, refused = build_hostile(case, marker)
    path = write_pt(tmp_path / MODEL, pkl)
    with pytest.raises(UnsafePickleError) as info:
        load_tree(path)
    assert refused in info.value.message and str(path) in info.value.message
    assert "Nothing was executed" in info.value.message
    assert not marker.exists()
    assert_payload_is_live(pkl, marker)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_scan_refuses_payload(
    tmp_path: Path, cli: Callable[..., CliResult], case: tuple[str, str, int]
) -> None:
    """`scan` on a checkpoint whose model file is hostile: exit 1 (damaged), file and global named, no traceback."""
    marker = tmp_path / "PWNED"
    pkl, refused = build_hostile(case, marker)
    root = hostile_checkpoint(tmp_path / "ckpt", pkl)
    args = ("--json",) if case[1] == "STACK_GLOBAL" else ()
    res = cli("scan", root, *args)
    assert_clean_failure(res, MODEL, refused, "Refused to load an unsafe pickle", rc=1)
    assert not marker.exists()


def test_payload_in_rank1_optimizer_file(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]
) -> None:
    """An otherwise fine checkpoint whose rank-1 optimizer file carries a payload after its real content."""
    marker = tmp_path / "PWNED"
    root = demo.copy(SPEC, tmp_path / "ckpt")
    target = root / TAG / optim_name(1)
    payload = R(G("posix", "system"), (f"touch {shlex.quote(str(marker))}",))
    replace_pkl(target, lambda pkl: append_item(pkl, "zz_payload", payload))
    with pytest.raises(UnsafePickleError, match=r"posix\.system"):
        load_tree(target)

    res = cli("scan", root)
    assert_clean_failure(res, optim_name(1), "posix.system", rc=1)
    doc = scan_json(cli, root)
    unreadable = error_findings(doc, "unreadable")
    assert any("posix.system" in f["message"] and f["file"] == str(target) for f in unreadable)
    assert not marker.exists()
    # control: the appended opcodes do run in an unrestricted unpickler
    assert_payload_is_live(append_item(b"\x80\x02}.", "k", payload), marker)


def test_build_setstate_trick_with_refused_global(tmp_path: Path) -> None:
    """BUILD stores `__setstate__ = os.system` on an object, a second BUILD would call it: refused first."""
    marker = tmp_path / "PWNED"
    od = R(G("collections", "OrderedDict"), ())
    tree = [
        Build(od, (None, {"__setstate__": G("os", "system")})),
        Build(od, f"touch {shlex.quote(str(marker))}"),
    ]
    for protocol in (2, 4):
        pkl = dumps({"module": tree}, protocol)
        path = write_pt(tmp_path / f"p{protocol}.pt", pkl)
        with pytest.raises(UnsafePickleError, match=r"os\.system"):
            load_tree(path)
        assert not marker.exists()
        assert_payload_is_live(pkl, marker)


def test_build_cannot_shadow_methods_of_stand_ins(tmp_path: Path) -> None:
    """Allowlisted objects cannot be given instance attributes that shadow methods (`get`, `__setstate__`)."""
    evil = G("builtins", "bytearray")
    od = R(G("collections", "OrderedDict"), ())
    rec = R(G("deepspeed.utils.tensor_fragment", "fragment_address"), ())
    tree = {
        "module": Build(od, (None, {"get": evil, "items": evil, "__setstate__": evil, "_metadata": {"": 1}})),
        "again": Build(od, 12),  # would call the shadowing __setstate__ with 12
        "frag": Build(rec, {"numel": 3, "start": 4, "get": evil, "__setstate__": evil}),
        "frag_again": Build(rec, {"start": 5}),
    }
    path = write_pt(tmp_path / "shadow.pt", dumps(tree))
    out = load_tree(path)
    module, frag = out["module"], out["frag"]
    assert module.get("missing", "default") == "default"
    assert list(module.items()) == []
    assert module._metadata == {"": 1}  # torch's state_dict metadata attribute survives
    assert frag.get("numel") == 3 and frag.start == 5
    assert "get" not in vars(frag) and "__setstate__" not in vars(frag)


def test_build_cannot_patch_stand_in_classes(tmp_path: Path, demo: DemoCache) -> None:
    """BUILD on a stand-in *class* (ZeroStageEnum, LossScaler, OrderedDict) must not patch it process-wide."""
    benign = load_tree(demo(SPEC) / TAG / optim_name(0))["optimizer_state_dict"]
    classes = [ZeroStage, type(benign["loss_scaler"]), type(benign["param_slice_mappings"][0])]
    before = [set(vars(c)) for c in classes]
    evil = G("builtins", "bytearray")
    targets = [
        G("deepspeed.runtime.zero.config", "ZeroStageEnum"),
        G("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
        G("collections", "OrderedDict"),
    ]
    try:
        for i, target in enumerate(targets):
            attrs = {"__int__": evil, "__index__": evil, "__repr__": evil, "get": evil, "cur_scale": 7.0}
            path = write_pt(tmp_path / f"patch{i}.pt", dumps([Build(target, (None, attrs))]))
            with contextlib.suppress(CorruptFileError):
                load_tree(path)
        assert [set(vars(c)) for c in classes] == before
        assert int(ZeroStage(2)) == 2 and repr(ZeroStage(3)) == "ZeroStage(3)"
        ckpt = scan(str(demo(SPEC)))
        assert ckpt.stage == 2 and ckpt.loss_scale == 1.0 and not ckpt.findings
    finally:  # undo any patching so the rest of this worker's tests are unaffected
        for cls, names in zip(classes, before, strict=True):
            for attr in set(vars(cls)) - names:
                delattr(cls, attr)


def test_loss_scaler_shadowing_get_does_not_crash_scan(
    tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loss scaler pickled with a `get` attribute (BUILD state) must not hijack scaler.get() in scan."""
    from inspector.demo import ranks as demo_mod
    from inspector.demo.writer import write_demo
    from inspector.format import ptwriter as pw

    original = demo_mod._loss_scaler

    def evil_scaler(spec: DemoSpec) -> Any:
        obj = original(spec)
        obj.state = {**obj.state, "get": pw.Global("builtins", "bytearray")}
        return obj

    monkeypatch.setattr(demo_mod, "_loss_scaler", evil_scaler)
    root = tmp_path / "ckpt"
    write_demo(str(root), SPEC)
    res = cli("scan", root, "--json")
    assert "Traceback" not in res.output, res.output
    assert res.rc == 0 and json.loads(res.stdout)["loss_scale"] == 1.0


def test_memo_bomb_is_refused(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """`LONG_BINPUT 0x10000000` would make the C unpickler zero-fill a 4 GiB memo table."""
    pkl = b"\x80\x02}" + b"r" + struct.pack("<I", 0x10000000) + b"."
    path = write_pt(tmp_path / MODEL, pkl)
    with pytest.raises(CorruptFileError, match="memo"):
        load_tree(path)
    root = hostile_checkpoint(tmp_path / "ckpt", pkl)
    res = cli("scan", root, memory_limit=1536 * 2**20)
    assert_clean_failure(res, MODEL, "cannot be read", rc=1)


def test_bytearray_bomb_is_refused(tmp_path: Path) -> None:
    """`bytearray(2**30)` would allocate a GiB on the pickle's say-so; only bytes are accepted."""
    path = write_pt(tmp_path / "ba.pt", dumps({"x": R(G("builtins", "bytearray"), (2**30,))}))
    with pytest.raises(CorruptFileError, match="bytearray"):
        load_tree(path)
    ok = write_pt(tmp_path / "ok.pt", pickle.dumps({"x": bytearray(b"ab")}, protocol=2))
    assert load_tree(ok) == {"x": bytearray(b"ab")}


def test_refused_name_with_escape_sequences_is_shown_inert(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """A global named with terminal escapes is refused and printed escaped, not raw."""
    pkl = dumps({"x": R(G("os\x1b]0;owned\x07", "system"), ("true",))}, 4)
    root = hostile_checkpoint(tmp_path / "ckpt", pkl)
    res = cli("scan", root)
    assert_clean_failure(res, MODEL, "os\\x1b", rc=1)
    assert "\x1b" not in res.output


def test_error_messages_are_not_rich_markup(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """Paths and names containing `[...]` are printed literally; `[/x]` must not crash the error printer."""
    res = cli("scan", tmp_path / "run[/x]" / "nope[bold]")
    assert_clean_failure(res, "run[/x]", "nope[bold]", rc=2)


@pytest.mark.parametrize("shape", ["deep", "shared"])
def test_metadata_bombs_do_not_crash_or_hang_scan(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], shape: str
) -> None:
    """A rank-1 ds_config nested 100k deep, or a 60-level shared tree (2**60 leaves): refused when the file is
    loaded (the input boundary bounds depth and expanded size once, for every later walker), named, and the
    scan still ends cleanly."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    ops = deep_list_ops(100_000) if shape == "deep" else shared_tree_ops(60)
    replace_pkl(root / TAG / optim_name(1), lambda pkl: append_raw(pkl, "ds_config", ops))
    res = cli("scan", root, "--json", timeout=60)  # a hang raises TimeoutExpired
    assert "Traceback" not in res.output and res.rc == 1, res.output
    found = error_findings(json.loads(res.stdout), "unreadable")
    why = "levels deep" if shape == "deep" else "shared sub-trees"
    assert any(optim_name(1) in f["message"] and why in f["message"] for f in found), found


# --- damaged files --------------------------------------------------------------------------------------------------


def cut_points(path: Path) -> dict[str, int]:
    """Byte positions inside data.pkl, inside the first storage record, and inside the central directory."""
    with TorchZip(path) as z:
        pkl = f"{z.prefix}data.pkl"
        rec = f"{z.prefix}data/0"
        points = {
            "in-data.pkl": z.data_offset(pkl) + z.entries[pkl].size // 2,
            "in-record": z.data_offset(rec) + z.entries[rec].size // 2,
        }
    data = path.read_bytes()
    loc = data.rfind(b"PK\x06\x07")
    (eocd64,) = struct.unpack("<Q", data[loc + 8 : loc + 16])
    (cd_off,) = struct.unpack("<Q", data[eocd64 + 48 : eocd64 + 56])
    assert data[cd_off : cd_off + 4] == b"PK\x01\x02"
    points["in-central-directory"] = cd_off + 30
    return points


@pytest.mark.parametrize("where", ["in-data.pkl", "in-record", "in-central-directory"])
def test_truncated_model_file(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], where: str
) -> None:
    """A cut-off model-states file: exit 1 (damaged), 'truncated', the file named."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    path = root / TAG / MODEL
    cut = cut_points(path)[where]
    os.truncate(path, cut)
    with pytest.raises(CorruptFileError, match="truncated"):
        load_tree(path)
    assert_clean_failure(cli("scan", root), MODEL, "truncated", rc=1)


@pytest.mark.parametrize("where", ["in-data.pkl", "in-record", "in-central-directory"])
def test_truncated_optimizer_file(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], where: str
) -> None:
    """A cut-off rank-1 optimizer file: an 'unreadable' error finding naming it, exit 1."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    path = root / TAG / optim_name(1)
    os.truncate(path, cut_points(path)[where])
    doc = scan_json(cli, root)
    found = error_findings(doc, "unreadable")
    assert any(f["file"] == str(path) and "truncated" in f["message"] for f in found)
    assert "model.embed_tokens.weight" not in {t["name"] for t in doc["tensors"]}  # cannot be rebuilt


def test_damaged_record_inside_intact_archive(tmp_path: Path, demo: DemoCache) -> None:
    """A record shorter than its storage (sizes rewritten consistently) is caught when the tree is read."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    path = root / TAG / optim_name(0)
    with zipfile.ZipFile(path) as zin:
        entries = [(i.filename, zin.read(i.filename)) for i in zin.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
        for name, data in entries:
            zout.writestr(name, data[: len(data) // 2] if name.endswith("/data/0") else data)
    with pytest.raises(CorruptFileError, match="should hold"):
        load_tree(path)


@pytest.mark.parametrize(
    ("kind", "needle", "rc"),
    [
        ("empty", "empty", 1),
        ("random", "not a torch.save archive", 1),
        ("legacy", "not a DeepSpeed model-states file", 1),  # the legacy container, read: same boundary
        ("not-a-dict", "not a DeepSpeed model-states file", 1),  # crafted: the input boundary's error
    ],
)
def test_bad_model_file(
    tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult], kind: str, needle: str, rc: int
) -> None:
    """Empty or random model file: damaged, exit 1. Wrong content, in either container (zip or legacy): not a
    model-states file, exit 1. A clear message either way."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    path = root / TAG / MODEL
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(random.Random(7).randbytes(4096).replace(b"\x80", b"\x81", 1))
    elif kind == "legacy":
        torch.save([1, 2, 3], path, _use_new_zipfile_serialization=False)
        assert path.read_bytes()[:1] == b"\x80"
    else:
        torch.save([1, 2, 3], path)
    assert_clean_failure(cli("scan", root), MODEL, needle, rc=rc)


def test_unreadable_model_file(tmp_path: Path, demo: DemoCache, cli: Callable[..., CliResult]) -> None:
    """A model file without read permission: "permission denied", exit 1. Root reads files whatever their
    mode (and CI runs as root), so the CLI runs without that right: the test means the same for everyone."""
    root = demo.copy(SPEC, tmp_path / "ckpt")
    path = root / TAG / MODEL
    path.chmod(0)
    try:
        assert_clean_failure(cli("scan", root, file_modes_bind=True), MODEL, "permission denied", rc=1)
        path.chmod(0o644)  # the same copy readable again: what failed above was the permission, nothing else
        assert cli("scan", root, file_modes_bind=True).rc == 0
    finally:
        path.chmod(0o644)



def test_opcode_stream_is_what_we_think(tmp_path: Path) -> None:
    """Sanity for the crafting helpers: INST/OBJ/STACK_GLOBAL/BUILD really appear in the pickles."""
    marker = tmp_path / "m"
    ops = {
        d: {op.name for op, _, _ in pickletools.genops(build_hostile((n, d, p), marker)[0])}
        for n, d, p in [("os.system", "INST", 0), ("os.system", "OBJ", 1), ("os.system", "STACK_GLOBAL", 4)]
    }
    assert "INST" in ops["INST"] and "OBJ" in ops["OBJ"] and "STACK_GLOBAL" in ops["STACK_GLOBAL"]
    od = R(G("collections", "OrderedDict"), ())
    assert "BUILD" in {op.name for op, _, _ in pickletools.genops(dumps([Build(od, {"a": 1})]))}
