"""A command scans its checkpoint once: `convert`/`preflight --selection NAME` resolve the name in the scan
the plan reads (they used to scan for the name, then again for the plan; `preflight` a third time for its
damage check), counted by wrapping the one scan entry point and running the command in this process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import inspector.scan.scanner
from inspector.cli.main import main
from tests.scan.layout_cases import ckpt_dir

PIPE = ckpt_dir("pp_z1_bf16")  # two stages: `stage 1` is a proposed selection


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every call of `scanner.scan` from now on, recorded (and carried out)."""
    calls: list[tuple[Any, ...]] = []
    real: Callable[..., Any] = inspector.scan.scanner.scan

    def scan(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(inspector.scan.scanner, "scan", scan)
    return calls


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "OUT", "--selection", "stage 1"],
        ["convert", "OUT", "--selection", "stage 1", "--progress", "json"],
        ["convert", "OUT"],
        ["preflight", "--selection", "stage 1"],
        ["preflight", "--selection", "stage 1", "--json"],
        ["preflight"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_command_scans_its_checkpoint_once(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, *rest = argv
    rest = [str(tmp_path / "out") if a == "OUT" else a for a in rest]
    calls = _counted(monkeypatch)
    assert main([command, str(PIPE), *rest]) == 0
    assert len(calls) == 1, calls
    if command == "convert" and "--selection" in rest:  # the narrowing still holds: stage 1's tensors only
        from safetensors.numpy import load_file

        got = load_file(str(tmp_path / "out" / "model.safetensors"))
        assert set(got) == {"tied_modules.embed.weight", "4.weight", "4.bias"}


def test_a_saved_selection_is_resolved_in_the_same_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.numpy import load_file

    from inspector.convert import selection_store as store

    store.save(str(PIPE), "mine", "global_step3", frozenset({"4.weight"}))  # as the app's `m` saves it
    calls = _counted(monkeypatch)
    assert main(["convert", str(PIPE), str(tmp_path / "out"), "--selection", "mine"]) == 0
    assert len(calls) == 1, calls
    assert set(load_file(str(tmp_path / "out" / "model.safetensors"))) == {"4.weight"}
