"""`preflight --ram 16GB` (#42 item 6): "fits on a 16 GB node?", judged with the same predicted figures a plain
preflight prints, only the budget being the one asked for; a size that does not read is an Invalid option."""

from __future__ import annotations

import json
from typing import Any

from inspector.errors import EXIT_DOES_NOT_FIT
from tests.tui.conftest import SMALL


def test_ram_budget_judges_the_same_figures(demo: Any, cli: Any) -> None:
    root = demo(SMALL)
    here = json.loads(cli("preflight", root, "--json").stdout)
    big = cli("preflight", root, "--json", "--ram", "16GB")
    assert big.rc == 0, big.output
    node = json.loads(big.stdout)
    assert node["available_memory_bytes"] == 16 * 10**9 and node["memory_limit_source"] == "chosen"
    keep = ("predicted_peak_rss_bytes", "output_bytes", "read_bytes")
    assert {k: node.get(k) for k in keep} == {k: here.get(k) for k in keep}
    small = cli("preflight", root, "--json", "--ram", "1MB")
    assert small.rc == EXIT_DOES_NOT_FIT and json.loads(small.stdout)["fits"] is False
    bad = cli("preflight", root, "--ram", "lots")
    assert bad.rc != 0 and "Invalid option" in bad.output and "Traceback" not in bad.output
