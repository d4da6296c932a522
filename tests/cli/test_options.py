"""`--format`'s help comes from the output kinds themselves: a new kind is one module, never a line in the CLI."""

from __future__ import annotations

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
