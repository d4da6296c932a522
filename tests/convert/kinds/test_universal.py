"""Universal checkpoint writer on demo checkpoints: files, contents, atomic/resumable output, refusal."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from inspector.convert.kinds.universal.plan import iter_rel_paths, plan_universal
from inspector.convert.reader import read_ref, read_tensor
from inspector.convert.root import PARTIAL
from inspector.convert.stripes import small_slices
from inspector.demo.writer import DemoSpec
from inspector.errors import OutputError
from inspector.format.records import ZeroStage
from inspector.format.torchzip import load_tree
from inspector.scan.model import Kind
from inspector.scan.scanner import scan
from tests.conftest import pt_save
from tests.convert.jobs import universal as write_universal
from tests.convert.jobs import universal_job

SPECS = {
    "s1": DemoSpec(stage=1, params=200_000),
    "s2": DemoSpec(stage=2, world_size=3, params=200_000),
    "s3": DemoSpec(stage=3, world_size=3, params=200_000, sub_group_size=20_000),
    "bf16opt": DemoSpec(stage=1, params=200_000, bf16_optimizer=True),
    "fp16": DemoSpec(stage=2, dtype="fp16", params=200_000),
}


def _f32(x: Any) -> np.ndarray:
    """fp32 numpy from read_tensor's result, whether it returns torch tensors or numpy arrays."""
    if isinstance(x, torch.Tensor):
        return x.float().numpy()
    return np.asarray(x).astype(np.float32)


def _same(a: Any, b: Any) -> bool:
    x, y = _f32(a), _f32(b)
    return x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32))


def _param(path: Path) -> torch.Tensor:
    d = torch.load(path, map_location="cpu", weights_only=True)
    assert set(d) == {"param", "cat_dim"} and d["cat_dim"] == 0
    return d["param"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_state_is_the_rebuilt_tensor(demo: Any, tmp_path: Path, name: str) -> None:
    ckpt = scan(str(demo(SPECS[name])))
    plan = plan_universal(ckpt, str(tmp_path))
    report = write_universal(plan)
    out = Path(plan.out_dir)
    assert (tmp_path / "latest_universal").read_text() == f"{ckpt.tag}_uni"
    assert not os.path.exists(plan.out_dir + PARTIAL)
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert written == set(iter_rel_paths(plan))
    assert report.tensors == len(plan.files)
    for t in ckpt.tensors:
        folder = out / "zero" / t.name
        if t.kind is Kind.TRAINABLE:
            for state in ("fp32", "exp_avg", "exp_avg_sq"):
                got = _param(folder / f"{state}.pt")
                assert got.dtype == torch.float32 and tuple(got.shape) == t.shape
                assert _same(got, read_tensor(ckpt, t.name, state)), (t.name, state)
            assert (folder / "step.pt").exists() == (ckpt.stage < 3)
        elif t.kind is Kind.FROZEN:
            assert _same(_param(folder / "fp32.pt"), read_tensor(ckpt, t.name))
        else:
            assert not folder.exists()  # buffers and tied aliases live in the model-states copies
    for f in ckpt.files:
        if f.role == "model":
            assert (out / os.path.basename(f.path)).read_bytes() == Path(f.path).read_bytes()


@pytest.mark.parametrize("name", ["s2", "s3", "bf16opt"])
def test_optimizer_state_keeps_what_load_universal_reads(demo: Any, tmp_path: Path, name: str) -> None:
    ckpt = scan(str(demo(SPECS[name])))
    plan = plan_universal(ckpt, str(tmp_path))
    write_universal(plan)
    sd = load_tree(os.path.join(plan.out_dir, "zero", "optimizer_state.pt"))
    assert sd["param_groups"] and "lr" in sd["param_groups"][0]
    if ckpt.stage == 3:
        inner = sd["optimizer_state_dict"]
        assert "fp32_flat_groups" not in sd
        assert all(set(s) == {"step"} for s in inner["state"].values())  # moments are per parameter
        assert int(read_ref(inner["state"][0]["step"])) == ckpt.optimizer_step
        assert isinstance(sd["zero_stage"], ZeroStage)
    else:
        for key in ("base_optimizer_state", "single_partition_of_fp32_groups", "param_slice_mappings"):
            assert key not in sd
        if name != "bf16opt":
            assert sd["clip_grad"] is not None and sd["loss_scaler"].get("cur_scale") is not None
        step = load_tree(os.path.join(plan.out_dir, "zero", ckpt.tensors[0].name, "step.pt"))
        assert int(read_ref(step)) == ckpt.optimizer_step


def as_killed(plan: Any, staging: Path) -> None:
    """What a run killed after finishing its files leaves beside the staging folder: the journal naming the
    job, then one line (name, size, CRC-32) per finished file, as the executor appends them."""
    import json
    import zlib

    from inspector.convert.journal import JOURNAL

    with open(staging.parent / JOURNAL, "w") as fh:
        fh.write(json.dumps({"job": universal_job(plan).identity}) + "\n")
        for rel in [*(f.rel for f in plan.files), *(n for _, n, _ in plan.copies)]:
            if (staging / rel).is_file():
                data = (staging / rel).read_bytes()
                line = {"file": f"{plan.folder}/{rel}", "size": len(data), "crc32": zlib.crc32(data)}
                fh.write(json.dumps(line) + "\n")


def test_refuses_existing_output_and_resumes_a_killed_run(demo: Any, tmp_path: Path) -> None:
    ckpt = scan(str(demo(SPECS["s2"])))
    plan = plan_universal(ckpt, str(tmp_path))
    write_universal(plan)
    with pytest.raises(OutputError):
        write_universal(plan)
    (tmp_path / "latest_universal").write_text("something_else")
    os.rename(plan.out_dir, str(tmp_path / "elsewhere"))
    with pytest.raises(OutputError):  # a different latest_universal is not replaced silently
        write_universal(plan)
    os.rename(str(tmp_path / "elsewhere"), plan.out_dir + PARTIAL)  # as a killed run would leave it
    os.remove(os.path.join(plan.out_dir + PARTIAL, plan.files[0].rel))
    as_killed(plan, Path(plan.out_dir + PARTIAL))  # the staging folder of this very job, journal included
    report = write_universal(plan, overwrite=True)
    assert report.resumed_shards == len(plan.files) + len(plan.copies) - 1  # tensor files and copies
    assert (tmp_path / "latest_universal").read_text() == plan.folder
    assert _same(_param(Path(plan.out_dir) / plan.files[0].rel), read_tensor(ckpt, plan.files[0].name))


def test_cli_writes_into_the_checkpoint_root_and_scan_still_reads_the_zero_one(
    demo: Any, tmp_path: Path, cli: Any
) -> None:
    import json

    root = demo.copy(SPECS["s1"], tmp_path / "ckpt")
    rc, out, err = cli("convert", root, root, "--format", "universal")
    assert rc == 0, err
    assert (root / "latest_universal").is_file() and (root / "latest").is_file()
    rc, out, err = cli("scan", root, "--json")
    assert rc == 0, err
    assert json.loads(out)["tag"] == "global_step3"  # the ZeRO checkpoint, not the universal one
    rc, out, err = cli("verify", root, root)  # OUT is where latest_universal was written
    assert rc == 0 and "universal" in out, out + err
    rc, out, err = cli("convert", root, root, "--format", "universal")
    assert rc == 2 and "--overwrite" in out + err


@pytest.mark.parametrize("name", ["s2", "s3"])
def test_scan_reads_a_universal_checkpoint_back(demo: Any, tmp_path: Path, name: str) -> None:
    ckpt = scan(str(demo(SPECS[name])))
    write_universal(plan_universal(ckpt, str(tmp_path)))
    uni = scan(str(tmp_path))  # via latest_universal
    assert uni.layout == "universal" and not uni.errors
    assert uni.optimizer_step == ckpt.optimizer_step and uni.global_steps == ckpt.global_steps
    assert {t.name: t.kind for t in uni.tensors} == {t.name: t.kind for t in ckpt.tensors}
    for t in ckpt.tensors:
        assert _same(read_tensor(uni, t.name), read_tensor(ckpt, t.name)), t.name
        if t.kind is Kind.TRAINABLE:
            for m in ("exp_avg", "exp_avg_sq"):
                assert _same(read_tensor(uni, t.name, m), read_tensor(ckpt, t.name, m))


def test_universal_converts_to_safetensors_and_verifies(demo: Any, tmp_path: Path, cli: Any) -> None:
    root = demo(SPECS["s3"])
    rc, _, err = cli("convert", root, tmp_path / "u", "--format", "universal")
    assert rc == 0, err
    rc, out, err = cli("verify", root, tmp_path / "u")
    assert rc == 0 and "OK" in out, out + err
    rc, _, err = cli("convert", tmp_path / "u", tmp_path / "st", "--dtype", "fp32")
    assert rc == 0, err
    rc, out, err = cli("verify", tmp_path / "u", tmp_path / "st")
    assert rc == 0, out + err
    from safetensors.torch import load_file

    ckpt = scan(str(root))
    st = load_file(tmp_path / "st" / "model.safetensors")
    for t in ckpt.tensors:
        assert _same(st[t.name], read_tensor(ckpt, t.name)), t.name


def test_verify_finds_a_changed_moment(demo: Any, tmp_path: Path, cli: Any) -> None:
    root = demo(SPECS["s2"])
    rc, _, err = cli("convert", root, tmp_path, "--format", "universal")
    assert rc == 0, err
    ckpt = scan(str(root))
    name = next(t.name for t in ckpt.tensors if t.kind is Kind.TRAINABLE)
    uni = scan(str(tmp_path))
    seg = dict(uni.tensor(name).moments)["exp_avg_sq"][0]
    with open(seg.file, "r+b") as fh:
        fh.seek(seg.offset)
        b = fh.read(1)
        fh.seek(seg.offset)
        fh.write(bytes([b[0] ^ 1]))
    rc, out, err = cli("verify", root, tmp_path)
    assert rc == 1 and f"{name}/exp_avg_sq" in out, out + err


def test_planning_and_reading_universal_need_no_torch_or_ui() -> None:
    import subprocess
    import sys

    code = (
        "import sys, inspector.convert.kinds.universal.plan, inspector.convert.kinds.universal.verify, "
        "inspector.scan.layouts.universal.scanner; print(' '.join(sys.modules))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert not {"torch", "deepspeed", "rich", "textual"} & loaded


def test_preflight_predicts_the_exact_output_size(demo: Any, tmp_path: Path, cli: Any) -> None:
    import json

    root = demo(SPECS["s3"])
    rc, out, err = cli("preflight", root, "--format", "universal", "--out", tmp_path, "--json")
    assert rc == 0, err
    est = json.loads(out)
    assert est["format"] == "universal" and est["fits"]
    assert est["deepspeed_ds_to_universal_peak_disk_bytes"] > est["output_bytes"]
    rc, _, err = cli("convert", root, tmp_path, "--format", "universal")
    assert rc == 0, err
    written = sum(p.stat().st_size for p in (tmp_path / "global_step3_uni").rglob("*") if p.is_file())
    assert abs(written - est["output_bytes"]) <= 0.01 * written  # small files' overhead is estimated


def test_a_hostile_pickle_in_a_universal_folder_is_refused_not_run(demo: Any, tmp_path: Path) -> None:
    from inspector.format import ptwriter as pw

    ckpt = scan(str(demo(SPECS["s2"])))
    write_universal(plan_universal(ckpt, str(tmp_path)))
    name = next(t.name for t in ckpt.tensors if t.kind is Kind.TRAINABLE)
    marker = tmp_path / "pwned"
    evil = pw.Reduce(pw.Global("os", "system"), (f"touch {marker}",))
    pt_save({"param": evil, "cat_dim": 0}, tmp_path / f"{ckpt.tag}_uni" / "zero" / name / "exp_avg.pt")
    uni = scan(str(tmp_path))
    assert any(f.code == "unreadable" and "os.system" in f.message for f in uni.errors)
    assert not marker.exists()


def test_preflight_predicts_a_fresh_converter_not_this_process(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The universal estimate follows preflight.converter_base (the same model as the safetensors path),
    so a process that already holds a lot (the TUI) gets the CLI's answer."""
    from inspector.convert import preflight
    from inspector.convert.kinds.universal import preflight as up
    from inspector.system import rss

    plan = plan_universal(scan(str(demo(SPECS["s3"]))), str(tmp_path))
    before = up.assess_universal(plan, workers=2).predicted_peak_rss
    monkeypatch.setattr(rss, "current_rss", lambda: 50 * 2**30)  # as if this process held 50 GiB
    assert up.assess_universal(plan, workers=2).predicted_peak_rss == before
    base, _ = preflight.converter_base(
        sum(preflight.kept_records(f.segments) for f in plan.files),
        len({f.name for f in plan.files}),
        len(plan.source),
    )
    assert before == base + up.buffer_bytes(plan, 2) + preflight.RUNTIME_OVERHEAD + up.UNIVERSAL_RUNTIME


def test_preflight_counts_only_the_buffers_the_writer_touches(demo: Any, tmp_path: Path) -> None:
    """Buffers are np.empty and live for one file: small files make only their own size resident, and only
    `workers` files are in flight (the estimate used to charge every worker a full chunk)."""
    from inspector.convert.kinds.universal.preflight import buffer_bytes
    from inspector.convert.kinds.universal.tensors import MAX_CHUNK

    CHUNK_BYTES = MAX_CHUNK * 4
    plan = plan_universal(scan(str(demo(SPECS["fp16"]))), str(tmp_path))  # files well under one chunk
    largest = sorted((min(f.nbytes, CHUNK_BYTES) for f in plan.files), reverse=True)
    assert largest[0] < CHUNK_BYTES
    widen = any(f.source_dtype != "float32" for f in plan.files)
    assert buffer_bytes(plan, 2) <= (largest[0] + largest[1]) * (5 if widen else 2) // 2
    assert buffer_bytes(plan, 1) < buffer_bytes(plan, 2) <= buffer_bytes(plan, 8)


def test_output_kinds_offers_universal_where_the_optimizer_state_allows(demo: Any, tmp_path: Path) -> None:
    """The registry's offers are the one list the CLI and the TUI share: universal is on it, with a reason
    when not."""
    from inspector.convert.kinds import offers

    ckpt = scan(str(demo(SPECS["s2"])))
    uni = {o.name: o for o in offers(ckpt)}["universal"]
    assert uni.available and uni.reason == ""
    plan = plan_universal(ckpt, str(tmp_path))
    write_universal(plan)
    back = {o.name: o for o in offers(scan(plan.out_dir))}["universal"]
    assert not back.available and "optimizer files" in back.reason  # a universal checkpoint read back


def test_progress_json_streams_universal_convert_and_verify(demo: Any, tmp_path: Path, cli: Any) -> None:
    """`convert --format universal --progress json` and `verify --progress json` speak the TUI's JSON lines."""
    import json

    root = demo(SPECS["s3"])
    rc, stdout, stderr = cli("convert", root, tmp_path, "--format", "universal", "--progress", "json")
    assert rc == 0, stdout + stderr
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert events[0]["event"] == "start" and events[0]["kind"] == "universal"
    report = events[-1]
    assert report["event"] == "report" and report["out_dir"] == str(tmp_path / "global_step3_uni")
    assert report["bytes_written"] > 0 and report["tensors"] == events[0]["tensors"]
    rc, stdout, stderr = cli("verify", root, tmp_path, "--progress", "json")
    assert rc == 0, stdout + stderr
    verified = json.loads(stdout.splitlines()[-1])
    assert verified["event"] == "verified" and verified["ok"] and verified["checked"] == report["tensors"]
    rc, stdout, _ = cli("convert", root, tmp_path, "--format", "universal", "--progress", "json")
    assert rc != 0 and json.loads(stdout.splitlines()[-1])["event"] == "error"  # refuses to overwrite


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_resume_rewrites_a_finished_file_damaged_since(demo: Any, tmp_path: Path, damage: str) -> None:
    """A killed run's finished files are kept only if they still have the size and CRC-32 the journal
    recorded when they were finished: one truncated to 0 bytes or bit-flipped since is written again, and
    the result equals an undisturbed export (the rerun used to keep the damage and exit 0)."""
    import shutil as _shutil

    ckpt = scan(str(demo(SPECS["s2"])))
    clean = tmp_path / "clean"
    write_universal(plan_universal(ckpt, str(clean)))
    out = tmp_path / "out"
    plan = plan_universal(ckpt, str(out))
    write_universal(plan)
    staging = Path(plan.out_dir + PARTIAL)  # rebuild the state a SIGKILL after the last file leaves
    _shutil.move(plan.out_dir, staging)
    (out / "latest_universal").unlink()
    victim = staging / plan.files[0].rel
    as_killed(plan, staging)
    if damage == "truncate":
        victim.write_bytes(b"")
    else:
        raw = bytearray(victim.read_bytes())
        raw[-100] ^= 0x10
        victim.write_bytes(bytes(raw))
    report = write_universal(plan)
    assert report.resumed_shards == len(plan.files) + len(plan.copies) - 1  # tensor files and copies
    assert (Path(plan.out_dir) / plan.files[0].rel).read_bytes() == (
        Path(clean) / f"{ckpt.tag}_uni" / plan.files[0].rel
    ).read_bytes()


def test_journal_holds_each_files_crc_computed_while_writing(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part journals every tensor file it finishes with the CRC-32 the zip writer computed on the bytes in
    hand (no read back: the root's crc32 is not called); each is the file's true CRC, so the finishing run
    reuses them all."""
    import zlib

    from inspector.convert.executor import execute
    from inspector.convert.journal import JOURNAL
    from inspector.convert.root import OutputRoot
    from inspector.convert.staging import part_suffix
    from tests.convert.jobs import journalled

    plan = plan_universal(scan(str(demo(SPECS["s2"]))), str(tmp_path))
    read_back: list[str] = []
    crc32 = OutputRoot.crc32

    def counted(self: Any, rel: str) -> int:
        read_back.append(rel)
        return crc32(self, rel)

    with monkeypatch.context() as m:
        m.setattr(OutputRoot, "crc32", counted)
        execute(universal_job(plan), part=(0, 1))
    assert read_back and not [r for r in read_back if "/zero/" in r]  # the model-states copies only
    sums = journalled(tmp_path / (JOURNAL + part_suffix((0, 1))))["crc32"]
    tensors = {f"{plan.folder}/{f.rel}" for f in plan.files}
    assert tensors <= set(sums)
    staging = Path(plan.out_dir + PARTIAL)
    for name in tensors:
        assert sums[name] == zlib.crc32((staging / name.split("/", 1)[1]).read_bytes()), name
    report = execute(universal_job(plan))
    assert report.resumed_shards == len(plan.files) + len(plan.copies)


def test_a_cold_export_asks_ahead_and_writes_the_same_bytes(
    demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a cold page cache each tensor's next READ_AHEAD bytes are asked of the kernel ahead of its reads,
    every source byte once and in order, and the export is byte for byte the one written without it; from a
    cached one, nothing is asked."""
    from inspector.convert import reader
    from inspector.convert.kinds.universal import tensors
    from inspector.convert.kinds.universal.shared_rows import SharedRows
    from inspector.convert.stripes import stripe_reads

    ckpt = scan(str(demo(DemoSpec(stage=3, world_size=2, dtype="bf16", params=400_000))))
    monkeypatch.setattr(tensors, "READ_AHEAD", 64 << 10)  # several windows per tensor at this size
    outs, asked = {}, {}
    for cold in (False, True):
        calls: list[tuple[str, int, int]] = []
        monkeypatch.setattr(reader.FilePool, "mostly_cold", lambda self, by_file, c=cold: c)
        monkeypatch.setattr(reader.FilePool, "advise", lambda self, p, o, n, c=calls: c.append((p, o, n)))
        out = tmp_path / f"cold{cold}"
        plan = plan_universal(ckpt, str(out))
        write_universal(plan, workers=2)
        outs[cold] = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        asked[cold] = calls
    assert outs[True] == outs[False] and outs[True]
    assert not asked[False]
    wanted = {(s.file, s.offset, s.nbytes) for f in plan.files for s in f.segments}
    pieces: dict[str, list[tuple[int, int]]] = {}
    for path, offset, n in asked[True]:
        pieces.setdefault(path, []).append((offset, offset + n))
    for path, offset, n in wanted:  # every segment covered by the pieces asked, end to end
        pos = offset
        for a, b in sorted(pieces.get(path, [])):
            if a <= pos < b:
                pos = b
        assert pos >= offset + n, (path, offset, n, pos)
    # and nothing asked outside them (or, for files gathered from stripes, outside their windows)
    windows = {
        (f, o, n) for st in SharedRows(None, plan.files, 2)._stripes for f, o, _, n in stripe_reads(st)
    }
    spans = sorted((p, o, o + n) for p, o, n in wanted | windows)
    for path, ranges in pieces.items():
        for a, b in ranges:
            assert any(p == path and o <= a and b <= e for p, o, e in spans), (path, a, b)


def test_verify_reads_small_stage3_slices_as_stripes_and_finds_each_change(
    demo: Any, tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of stage-3 parameters with small slices are checked from one window of each rank (the 126-layer
    demo at 1,024 ranks: 41 s slice by slice, 2.5 s so); a changed element is still found, whichever rank's
    slice and whichever member of a stripe it is in, and names only its own file."""
    from inspector.convert.kinds.universal import verify as uverify

    root = demo(DemoSpec(stage=3, world_size=8, params=400_000, layers=6, sub_group_size=50_000))
    out = tmp_path / "u"
    rc, _, err = cli("convert", root, out, "--format", "universal")
    assert rc == 0, err
    stripes: list[int] = []
    real = uverify._stripe

    def counted(pool: Any, st: Any, s: Any, cancel: Any) -> Any:
        stripes.append(len(st.tensors))
        return real(pool, st, s, cancel)

    monkeypatch.setattr(uverify, "_stripe", counted)
    ckpt = scan(str(root))

    def verified() -> Any:
        *_, res = uverify.verify_universal(ckpt, scan(str(out)))
        return res

    res = verified()
    assert res.ok and res.checked == 3 * sum(t.kind is Kind.TRAINABLE for t in ckpt.tensors) + sum(
        t.kind is Kind.FROZEN for t in ckpt.tensors
    )
    assert stripes and max(stripes) > 1  # runs of several members were read as stripes
    uni = scan(str(out))
    small = [t for t in ckpt.tensors if t.kind is Kind.TRAINABLE and small_slices(t.segments) is not None]
    assert len(small) >= 3
    for t, state, last in (
        (small[0], "fp32", True),
        (small[len(small) // 2], "exp_avg", False),
        (small[-1], "exp_avg_sq", True),
    ):
        segs = uni.tensor(t.name).segments if state == "fp32" else dict(uni.tensor(t.name).moments)[state]
        seg = segs[0]
        at = seg.offset + (seg.nbytes - 4 if last else 0)  # in the last rank's slice, or the first's
        with open(seg.file, "r+b") as fh:
            fh.seek(at)
            b = fh.read(1)
            fh.seek(at)
            fh.write(bytes([b[0] ^ 1]))
        assert verified().mismatched == [f"{t.name}/{state}"]
        with open(seg.file, "r+b") as fh:  # put back: the next change is the only one
            fh.seek(at)
            fh.write(b)
    rc, text, err = cli("verify", root, out)  # the command, as a user runs it
    assert rc == 0 and "OK" in text, text + err
