"""The one text-out rule (`text.py`): every control class escaped, every secret form redacted."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inspector.errors import InputError, InspectorError
from inspector.text import escape, has_unsafe, masked, redact, shown, shown_doc
from tests.hostile_text import CONTROLS, raw_controls


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_every_control_class_is_escaped_and_the_rest_kept(name: str) -> None:
    text = f"ckpt {CONTROLS[name]} é 中 [bold]"
    out = shown(text)
    assert not raw_controls(out), (name, out)
    assert out.startswith("ckpt ") and out.endswith(" é 中 [bold]")
    assert has_unsafe(text) and not has_unsafe(out)
    assert shown(out) == out  # idempotent: an exit may see text another exit already cleaned


def test_newlines_kept_only_when_asked() -> None:
    assert escape("a\nb") == "a\\nb"
    assert escape("a\nb\x1b", newlines=True) == "a\nb\\x1b"
    assert escape("é\n\u202e", newlines=True) == "é\n\\u202e"


@given(st.text())
def test_no_text_survives_with_a_control(text: str) -> None:
    assert not raw_controls(shown(text))
    assert not raw_controls(shown(text, newlines=True), newlines=True)


SECRET = "wJalrXUtnFEMI-K7MDENG"


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        ("endpoint http://user:" + SECRET + "@127.0.0.1:1/b", SECRET),
        ("endpoint http://user:p@" + SECRET + "@127.0.0.1:1/b@c", SECRET),  # an unencoded `@` in the password
        ("s3://b/k via https://AKIA:" + SECRET + "@minio:9000", SECRET),
        ("https://" + SECRET + "@example.com/x", SECRET),  # a token as the whole userinfo of an http URL
        ("GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AK&X-Amz-Signature=" + SECRET + " failed", SECRET),
        ("https://acct.blob.core.windows.net/c/k?sv=2022&sig=" + SECRET, SECRET),
        ("AccountName=dev;AccountKey=" + SECRET + ";BlobEndpoint=http://127.0.0.1:10000/dev", SECRET),
        ("Authorization: Bearer " + SECRET, SECRET),
        # #38 C.2: a fragment, a path parameter, any scheme, as a query is
        ("https://minio:9000/#api_key=" + SECRET, SECRET),
        ("endpoint http://127.0.0.1:9000/#access_key=AK&secret=" + SECRET + " refused", SECRET),
        ("s3://bucket/run#secret=" + SECRET, SECRET),
        ("https://h/p;sig=" + SECRET + "/x", SECRET),
        ("gs://b/k?X-Goog-Signature=" + SECRET, SECRET),
        ("BlobEndpoint=http://127.0.0.1:10000;AccountKey=" + SECRET, SECRET),
        ("api_key=" + SECRET, SECRET),
    ],
)
def test_secret_forms_are_redacted(text: str, hidden: str) -> None:
    out = shown(text)
    assert hidden not in out and "***" in out, out


def test_the_store_credential_variables_are_redacted_wherever_they_appear(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "AWS_SECRET_ACCESS_KEY": "aws-secret-1234",
        "AWS_SESSION_TOKEN": "aws-session-5678",
        "AZURE_STORAGE_ACCOUNT_KEY": "azure-key-abcd",
        "AZURE_STORAGE_SAS_TOKEN": "sv=2022&sig=azure-sas-efgh",
        "AZURE_CLIENT_SECRET": "azure-client-ijkl",
        "GOOGLE_SERVICE_ACCOUNT_KEY": '{"private_key": "gcs-key-mnop"}',
        "GOOGLE_BEARER_TOKEN": "gcs-bearer-qrst",
        "HF_TOKEN": "hf_uvwxyz123456",
        "FSSPEC_HTTP_PASSWORD": "fsspec-pass-789",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=dev;AccountKey=conn-key-0000;")
    for v in [*values.values(), "conn-key-0000"]:
        out = shown(f"the store said: {v}!")
        assert v not in out and "***" in out, out
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "changed-secret-42")  # a changed value is seen at once
    assert "changed-secret-42" not in shown("x changed-secret-42")
    assert shown("aws-secret-1234") == "aws-secret-1234"  # the old one is no longer a secret of this process


@settings(max_examples=200, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "s3", "gs", "az", "abfs", "hf"]),
    path=st.text("abc/-_.0", max_size=8),
    where=st.sampled_from(["?", "#", ";", "?a=1&", "#x=y&", "?q=1#", ";p=2?"]),
    key=st.text("abcdefgh_-XYZ", min_size=1, max_size=10),
    after=st.sampled_from(["", "&n=1", " and more", "'", '"', "\n"]),
)
def test_every_url_parameter_value_is_hidden(
    scheme: str, path: str, where: str, key: str, after: str
) -> None:
    """One rule for a URL's query, fragment and path parameters, whatever the scheme and the key's name."""
    text = f"at {scheme}://host:1/{path}{where}{key}={SECRET}{after}"
    assert SECRET not in shown(text) and SECRET not in shown(text, newlines=True), shown(text)
    assert SECRET not in json.dumps(shown_doc({"u": text})) and SECRET not in masked(text)


def test_settings_and_plain_urls_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE1")  # an identity, not a secret
    monkeypatch.setenv("ZI_S3_TOKEN_LIMIT", "1")  # too short to be a secret: hiding it would garble messages
    for text in (
        "s3://bucket/run/checkpoint-6/global_step6",
        "abfs://container@account.dfs.core.windows.net/run",  # a container, not a user
        "AKIDEXAMPLE1 read 1 file",
        "https://huggingface.co/org/model",
        "s3://bucket/lr=0.1/run#1/global_step6",  # `=` and `#` in object keys, no parameter
    ):
        assert redact(text) == text


def test_json_documents_are_cleaned_in_keys_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue9")
    doc = {"a\x1b": ["x\x9by", {"k": "hf_secretvalue9 \n"}], "n": 3, "f": 1.5, "b": True, "z": None}
    out = json.dumps(shown_doc(doc))
    assert "hf_secretvalue9" not in out and "\\u001b" not in out and "\\u009b" not in out
    assert shown_doc(doc)["n"] == 3 and shown_doc(doc)["a\\x1b"][1]["k"] == "*** \n"


def test_a_string_shown_as_a_key_and_as_a_value_keeps_each_rule() -> None:
    # a document shows each distinct string once, but a key never keeps a newline and a value does
    doc = {"a\nb": "a\nb", "rows": [{"a\nb": "a\nb"}] * 3}
    out = shown_doc(doc)
    assert list(out) == ["a\\nb", "rows"] and out["a\\nb"] == "a\nb"
    assert out["rows"] == [{"a\\nb": "a\nb"}] * 3


def test_user_errors_are_clean_however_they_are_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2hunter2")
    exc = InspectorError("at http://u:pw1234@h/\x1b[2J", hint="key hunter2hunter2\u202e", title="T\x07")
    text = f"{exc.title} {exc} {exc.hint}"
    assert "pw1234" not in text and "hunter2hunter2" not in text and not raw_controls(text, newlines=True)
    err = InputError("dir\x1b]0;x\x07/f.json", "field\x9b", "is wrong")
    assert not raw_controls(str(err), newlines=True) and "dir\\x1b]0;x\\x07/f.json: field\\x9b" in str(err)


def test_the_character_class_covers_every_unsafe_category_of_this_python() -> None:
    """The rule is one precompiled class (fast on non-ASCII text); it must hold every control, format,
    separator and surrogate character this interpreter's Unicode tables know."""
    import sys
    import unicodedata

    from inspector.text import UNSAFE_CATEGORIES, unsafe_char

    missed = [
        hex(cp)
        for cp in range(sys.maxunicode + 1)
        if unicodedata.category(chr(cp)) in UNSAFE_CATEGORIES and not unsafe_char(chr(cp))
    ]
    assert not missed
    assert not unsafe_char("é") and not unsafe_char("中") and not unsafe_char("×") and unsafe_char("\n")
