"""One table of schemes (`remote.backend.SCHEMES`): every row names a backend that exists, the extra and
package a missing client names, whether it is read and written, and what proves its ranged reads; the URL
rules, the backend choice, the output check and `verify`'s wording all read it."""

from __future__ import annotations

import importlib
import sys

import pytest

from inspector.errors import InspectorError, OutputError, StoreError
from inspector.remote.backend import FSSPEC, SCHEMES, provenance, scheme_row, split_url
from inspector.remote.upload import require_writable


def test_every_row_names_a_backend_class_that_exists() -> None:
    for name, row in {**SCHEMES, "any": FSSPEC}.items():
        module, _, cls = row.backend.partition(":")
        assert hasattr(importlib.import_module(module), cls), name


def test_the_buckets_are_written_and_only_the_rows_with_a_proof_are_trusted_for_ranges() -> None:
    assert [n for n, r in SCHEMES.items() if r.writable] == ["s3", "gs", "az"]
    for name, row in SCHEMES.items():  # a writable row names a destination class that exists
        module, _, cls = row.destination.partition(":")
        assert bool(row.destination) == row.writable, name
        assert not row.writable or hasattr(importlib.import_module(module), cls), name
    assert scheme_row("hf").proof is None and scheme_row("sftp") is FSSPEC
    assert "Content-Range" in provenance("https://host/run")
    assert "refused" in provenance("hf://org/model")
    assert "local files" in provenance("/data/run")


@pytest.mark.parametrize("url", ["https://host/out", "memory://b/out", "hf://org/out"])
def test_an_output_on_a_read_only_scheme_is_refused(url: str) -> None:
    with pytest.raises(OutputError, match="an output can be"):
        require_writable(url)


@pytest.mark.parametrize("name", [n for n, r in SCHEMES.items() if not r.readable])
def test_schemes_that_are_no_store_are_refused(name: str) -> None:
    with pytest.raises(InspectorError, match=r"read as a local path or not at all|not a store URL"):
        split_url(f"{name}://bucket/run")


@pytest.mark.parametrize(
    ("scheme", "modules", "extra"),
    [
        ("s3", ("boto3",), "s3"),
        ("gs", ("obstore", "obstore.store"), "gcs"),
        ("az", ("obstore", "obstore.store"), "azure"),
    ],
)
def test_a_missing_client_library_names_the_rows_package_and_extra(
    monkeypatch: pytest.MonkeyPatch, scheme: str, modules: tuple[str, ...], extra: str
) -> None:
    """Each bucket backend's lazy import, failing, refuses with what its row says to install."""
    row = scheme_row(scheme)
    module, _, cls = row.backend.partition(":")
    backend = getattr(importlib.import_module(module), cls)
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # import -> ImportError, also once imported
    with pytest.raises(StoreError, match=rf"(?s)needs {row.package}, .*zero-inspector\[{extra}\]"):
        backend(scheme, "zi-no-client")
