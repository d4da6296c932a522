"""`convert --executor ray` without a cluster: what is refused, and how (the cluster itself: tests/cluster)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from inspector.demo.writer import DemoSpec
from inspector.errors import InspectorError
from tests.conftest import CliResult, DemoCache

SPEC = DemoSpec(params=2_000_000)


def test_without_ray_installed_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from inspector.convert import ray_executor

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(InspectorError) as err:
        ray_executor.connect(None)
    assert "zero-inspector[ray]" in err.value.hint


@pytest.mark.parametrize(
    "extra, words",
    [(["--part", "0/2"], "--part and --executor ray"), (["--parts", "0"], "at least 1")],
)
def test_ray_with_another_split_or_no_parts_is_refused(
    demo: DemoCache, tmp_path: Path, cli: Callable[..., CliResult], extra: list[str], words: str
) -> None:
    r = cli("convert", demo(SPEC), tmp_path / "out", "--executor", "ray", *extra)
    assert r.rc == 2 and words in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
