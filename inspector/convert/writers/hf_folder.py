"""What turns safetensors shards into a folder `from_pretrained` loads: the files beside them, and the names.

Trainer writes `config.json`, `generation_config.json` and the tokenizer files into each `checkpoint-N/` next
to the DeepSpeed files (and Trainer-private state: optimizer, scheduler, rng states, `training_args.bin`).
These are copied byte for byte; the private files never are. The one edit: when `config.json` states a dtype
(`dtype` in transformers 5, `torch_dtype` before) that is not the dtype written, the copy states the truth.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field, replace

from inspector.convert.options import ConvertOptions
from inspector.errors import CorruptFileError, InspectorError
from inspector.remote.roots import parent_source, source_at
from inspector.scan.model import Checkpoint, Kind
from inspector.system.bytesource import ByteSource

CONFIG = "config.json"
# what from_pretrained / AutoTokenizer / AutoProcessor read; transformers 5 writes the chat template apart
MODEL_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)
REMOTE_CODE = ("configuration_*.py", "modeling_*.py", "tokenization_*.py", "processing_*.py")
# names torch.compile / DDP / Lightning put in front of every parameter name
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_forward_module.")


_CONFIG_MAX = 16 << 20  # a config.json is kilobytes; a larger one is not parsed


@dataclass(frozen=True)
class SideFile:
    """A file written beside the weights: copied from `source` (read through `origin`, the folder it was
    found in, so a link out of it is never followed), or `content` we wrote (an edited config)."""

    name: str
    source: str | None
    content: bytes | None = None
    origin: ByteSource | None = None
    nbytes: int = field(init=False, default=0)  # read once, when planned: a plan is frozen data

    def __post_init__(self) -> None:
        if self.content is not None:
            n = len(self.content)
        else:
            n = (self.origin or parent_source(self.source)).size_and_mtime(self.source)[0] if self.source else 0
        object.__setattr__(self, "nbytes", n)


def _listed(src: ByteSource, patterns: tuple[str, ...]) -> list[str]:
    """Names in the folder that match; each must be a regular file inside it (an upload-ready folder must
    never carry a key or /proc/self/environ that a link pointed at)."""
    try:
        names = src.listdir(src.root)
    except InspectorError:
        return []
    out = []
    for n in names:
        if not any(fnmatch.fnmatchcase(n, p) for p in patterns):
            continue
        kind = src.kind(n)
        if kind == "file":
            out.append(n)
        elif kind in ("outside", "other"):
            why = "a link to a file outside it" if kind == "outside" else "not a regular file"
            raise CorruptFileError(
                f"{os.path.join(src.root, n)} is {why}; it would be copied into the output folder, so it was "
                "not read.",
                hint="Replace it with the real file, or write the weights alone with --format weights.",
                title="Unsafe file beside the checkpoint",
            )
    return out


def find_side_files(folders: list[ByteSource], *, model: bool = True) -> list[SideFile]:
    """Config and tokenizer files from the first folder that has each (the checkpoint first, then a base)."""
    patterns = TOKENIZER_FILES + ((*MODEL_FILES, *REMOTE_CODE) if model else ())
    chosen: dict[str, SideFile] = {}
    for src in folders:
        for name in _listed(src, patterns):
            chosen.setdefault(name, SideFile(name, os.path.join(src.root, name), origin=src))
    return list(chosen.values())


def has_model_config(folder: str) -> bool:
    return source_at(folder).is_file(CONFIG)  # a bucket prefix too: a Trainer run read from s3://


def config_dtype_fix(side: list[SideFile], out_dtype: str) -> tuple[list[SideFile], str | None]:
    """If config.json states another dtype than the one written, an edited copy that states the truth."""
    out = []
    note = None
    for f in side:
        if f.name != CONFIG or f.source is None:
            out.append(f)
            continue
        try:
            cfg = (f.origin or parent_source(f.source)).read_json(f.source, _CONFIG_MAX, "config")
        except InspectorError:
            out.append(f)  # copied as is; from_pretrained will say what is wrong with it
            continue
        keys = [k for k in ("dtype", "torch_dtype") if isinstance(cfg, dict) and k in cfg]
        stated = {_stated_dtype(cfg[k]) for k in keys}  # any JSON value: a list or dict is named, not hashed
        if not keys or stated == {out_dtype}:
            out.append(f)
            continue
        for k in keys:
            cfg[k] = out_dtype
        note = (  # the value is shown through the exits' text-out rule (escaped, cut short)
            f"config.json says {' / '.join(sorted(stated))} but the weights are written as {out_dtype}; "
            f"the copy says {out_dtype}."
        )
        content = (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()  # as transformers writes it
        out.append(SideFile(f.name, f.source, content, f.origin))
    return out, note


def _stated_dtype(value: object) -> str:
    """A config's dtype as a note may name it: a string (at most 40 characters), else its JSON type, never its
    content (a crafted list or dict is not a dtype, and the copy replaces it anyway)."""
    if isinstance(value, str):
        return value if len(value) <= 40 else value[:40] + "…"
    kind = {dict: "an object", list: "a list", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
    return f"({kind}, not a dtype name)"


def model_folder_options(ckpt: Checkpoint, opts: ConvertOptions) -> tuple[ConvertOptions, list[str]]:
    """Options that make names match the model class: wrapper prefixes stripped, tied aliases dropped.

    transformers' save_pretrained stores a tied weight once under its source name (`model.embed_tokens.weight`,
    not `lm_head.weight`) and re-ties on load; a DeepSpeed checkpoint marks the second name as the alias."""
    notes = []
    strip = list(opts.strip_prefix)
    names = [t.name for t in ckpt.tensors]
    for prefix in WRAPPER_PREFIXES:
        if names and all(n.startswith(prefix) for n in names) and prefix not in strip:
            strip.append(prefix)
            notes.append(f"Wrapper prefix {prefix!r} removed from every name.")
    tied = tuple(t.name for t in ckpt.tensors if t.kind is Kind.TIED and t.alias_of)
    if tied and not opts.dedupe_tied:
        notes.append(
            "Tied weights stored once, as transformers saves them: "
            + ", ".join(f"{t.name} → {t.alias_of}" for t in ckpt.tensors if t.name in tied)
            + "."
        )
    exclude = opts.exclude + tuple(t for t in tied if t not in opts.exclude)
    return replace(opts, strip_prefix=tuple(strip), exclude=exclude), notes
