"""The shared options' help: `--format`'s comes from the output kinds themselves (a new kind is one module, never a
line in the CLI); `--workers`' states the ceiling the worker rule applies."""

from __future__ import annotations

import argparse

from inspector.cli import options
from inspector.cli.main import build_parser
from inspector.cli.options import format_help
from inspector.convert.kinds import DEFAULT, KINDS


def test_format_help_names_every_kind_with_its_own_words_default_first() -> None:
    text = format_help()
    assert text.startswith(f"the output kind: {DEFAULT} (the default: ")
    for k in KINDS:
        assert f"{k.name} (" in text and k.help in text, k.name
    positions = [text.index(f"{k.name} (") for k in KINDS if k.name != DEFAULT]
    assert positions == sorted(positions)  # the others in the registry's order


def test_convert_and_preflight_default_to_the_registrys_default() -> None:
    parser = build_parser()
    for argv in (["convert", "ckpt", "out"], ["preflight", "ckpt"]):
        assert parser.parse_args(argv).format == DEFAULT, argv


def test_the_workers_help_says_the_ceiling_the_rule_applies() -> None:
    """The help states the default's ceiling without importing `limits` into every command's start-up."""
    from inspector.system import limits

    assert options.LOCAL_THREADS_SAID == limits.LOCAL_THREADS
    assert options.ZIP_THREADS_SAID == limits.ZIP_THREADS
    p, q = argparse.ArgumentParser(), argparse.ArgumentParser()
    options.add_workers_option(p, exports=True)  # convert's, preflight's and the app's
    options.add_workers_option(q)  # health's: no export
    said, health = (" ".join(x.format_help().split()) for x in (p, q))
    assert f"at most {limits.LOCAL_THREADS} on local files" in said
    assert f"at most {limits.LOCAL_THREADS} on local files" in health
    assert f"{limits.ZIP_THREADS} for a universal export" in said and "universal" not in health
