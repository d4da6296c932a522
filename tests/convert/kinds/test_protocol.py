"""Every kind through the one protocol: the registry offers it (or says why not), its preflight answers in the
one JSON shape, its job converts and its own verify passes; hostile output names and linked side files are
refused for every kind that takes them, and nothing outside OUT is touched."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from inspector.cli.preflight import preflight_json
from inspector.convert.executor import Report
from inspector.convert.kinds import DEFAULT, KINDS, Job, OutputKind, Request, get, names, of_output, offers
from inspector.convert.options import ConvertOptions
from inspector.convert.preflight import assessment_json
from inspector.convert.verify import VerifyResult
from inspector.demo.writer import DemoSpec
from inspector.errors import InspectorError
from inspector.scan.scanner import scan
from tests.convert.kinds.hf import lora_checkpoint, offered_checkpoint

DEMO = DemoSpec(stage=2, world_size=2, dtype="bf16", params=60_000)


def _run(job: Job) -> Report:
    report = None
    for ev in job.run():
        if isinstance(ev, Report):
            report = ev
    assert report is not None
    return report


def _verify(out: Path, ckpt: Any) -> VerifyResult:
    kind = of_output(str(out))
    return [ev for ev in kind.verify(ckpt, str(out)) if isinstance(ev, VerifyResult)][-1]


def test_each_kind_is_one_module_under_its_own_name_in_the_registry() -> None:
    """The registry's rule, whatever the kinds: each entry an OutputKind named once, defined in its own module
    (or package) under convert/kinds/ that bears its name, reachable by that name; an unknown name refused."""
    assert KINDS and all(isinstance(k, OutputKind) for k in KINDS)
    assert len(set(names())) == len(KINDS) and DEFAULT in names()
    for k in KINDS:
        assert type(k).__module__ == f"inspector.convert.kinds.{k.name}", k.name
        assert get(k.name) is k
    with pytest.raises(InspectorError, match="Unknown output kind"):
        get("no-such-kind")


@pytest.mark.parametrize("kind", names())
def test_every_kind_plans_assesses_writes_and_verifies_through_the_protocol(
    kind: str, demo: Any, tmp_path: Path
) -> None:
    ckpt = offered_checkpoint(kind, demo, tmp_path, DEMO)
    offer = {o.name: o for o in offers(ckpt)}[kind]
    assert offer.available, offer.reason
    out = tmp_path / "out"
    job = get(kind).plan(ckpt, Request(ConvertOptions()), str(out))
    job.check_output(overwrite=False)
    verdict = job.assess()
    data = preflight_json(job, verdict)
    assert set(assessment_json(verdict)) <= set(data) and data["output_kind"] == job.kind
    assert data["files"] == [f.name for f in job.files] and data["tensors"] == job.tensor_count
    report = _run(job)
    on_disk = sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")
    )
    planned = sorted(f.name for f in job.files)
    assert on_disk == planned or (kind == "universal" and set(planned) <= set(on_disk) | {"latest_universal"})
    assert report.bytes_written > 0 and not [
        p for p in out.rglob("*") if p.name.endswith((".partial", ".tmp"))
    ]
    assert of_output(str(out)).name == kind
    assert _verify(out, ckpt).ok


@pytest.mark.parametrize("kind", ["weights", "model", "merged"])
@pytest.mark.parametrize("name", ["__metadata__", "../../victim", "a/b", "x\x1b]0;owned\x07"])
def test_a_hostile_output_name_is_refused_by_every_kind(
    kind: str, name: str, demo: Any, tmp_path: Path
) -> None:
    """`--rename` can make any name; each kind that renames refuses one that is not a plain, loadable name
    before anything is written (the adapter kind keeps PEFT's names and says --rename does not apply)."""
    ckpt = offered_checkpoint(kind, demo, tmp_path, DEMO)
    victim = tmp_path / "victim"
    out = tmp_path / "deep" / "out"
    opts = ConvertOptions(renames=((r"^.*$", name),))
    with pytest.raises(InspectorError) as err:
        job = get(kind).plan(ckpt, Request(opts), str(out))
        _run(job)
    assert "Traceback" not in str(err.value) and "\x1b" not in err.value.message
    assert not out.exists() and not victim.exists()


@pytest.mark.parametrize("kind", ["model", "adapter", "merged"])
def test_a_linked_side_file_is_never_copied(kind: str, demo: Any, tmp_path: Path) -> None:
    """A tokenizer file that links out of the checkpoint (to a secret): the kind refuses or leaves it out,
    and the secret's bytes never reach OUT."""
    ckpt = offered_checkpoint(kind, demo, tmp_path, DEMO)
    secret = tmp_path / "secret.txt"
    secret.write_text("AWS_SECRET_ACCESS_KEY=do-not-copy")
    link = Path(ckpt.root) / "tokenizer.json"
    if link.exists():
        link.unlink()
    link.symlink_to(secret)
    out = tmp_path / "out"
    try:
        _run(get(kind).plan(ckpt, Request(ConvertOptions()), str(out)))
    except InspectorError as exc:
        assert "do-not-copy" not in exc.message + exc.hint
    for p in out.rglob("*") if out.exists() else ():
        assert not p.is_symlink()
        assert not p.is_file() or b"do-not-copy" not in p.read_bytes()
    assert secret.read_text() == "AWS_SECRET_ACCESS_KEY=do-not-copy"


def test_front_ends_name_no_kind_in_their_code_paths() -> None:
    """The faces pick a kind by the name the user gave and talk to the protocol: no branch on a kind's name
    (help text and labels aside, which are strings passed to argparse or shown, never compared)."""
    import ast

    root = Path(__file__).resolve().parents[3] / "inspector"
    bad = []
    for path in [*(root / "cli").rglob("*.py"), *(root / "tui").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for c in ast.walk(node):
                    if isinstance(c, ast.Constant) and c.value in names():
                        bad.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not bad, "branches on a kind's name: " + ", ".join(bad)
    assert not os.path.exists(root / "cli" / "universal.py") and not os.path.exists(
        root / "tui" / "universal.py"
    )


def test_the_adapter_kind_says_that_renames_do_not_apply(demo: Any, tmp_path: Path) -> None:
    ckpt = lora_checkpoint(demo, tmp_path)
    job = get("adapter").plan(
        ckpt, Request(ConvertOptions(renames=((r"^.*$", "__metadata__"),))), str(tmp_path / "o")
    )
    assert any("--rename" in n and "do not apply" in n for n in job.notes)
    _run(job)
    assert _verify(tmp_path / "o", ckpt).ok


def test_force_reaches_every_kind_or_its_offer_says_it_never_converts_damage(demo: Any) -> None:
    """A kind either writes a damaged checkpoint with --force (converts_damaged) or says, as a code, that it
    is not offered for one: --force never silently fails to reach a kind."""
    from dataclasses import replace

    from inspector.convert.kinds.base import Why
    from inspector.scan.model import Finding, Severity

    ckpt = scan(str(demo(DemoSpec(stage=2, params=200_000))))
    damaged = replace(ckpt, findings=(Finding(Severity.ERROR, "test", "a damaged rank file"),))
    planned = []
    for kind in KINDS:
        if not kind.converts_damaged:
            assert kind.offer(damaged).why is Why.DAMAGED, kind.name
        elif kind.offer(damaged).available:
            assert kind.plan(damaged, Request(allow_damaged=True), "/nonexistent/out").files, kind.name
            planned.append(kind.name)
    assert "weights" in planned


@pytest.mark.parametrize(("kind", "checked"), [("merged", "recomputing the merge"), ("universal", "Adam moments")])
def test_verify_against_is_refused_the_same_way_by_kinds_without_a_source_to_choose(kind: str, checked: str) -> None:
    """`verify --against` means nothing to a merged model or a universal checkpoint: both refuse it through the
    protocol's one refusal, before anything is read, saying what they are checked against instead."""
    with pytest.raises(InspectorError) as refused:
        get(kind).verify(None, "/nonexistent", against="module")  # type: ignore[arg-type]
    assert refused.value.title == "Invalid option"
    assert refused.value.message.startswith("--against applies to safetensors outputs (weights, model, adapter); ")
    assert checked in refused.value.message
