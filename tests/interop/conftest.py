"""Interop fixtures: real DeepSpeed checkpoints, built once and cached, and DeepSpeed's own reading of them.

Everything that needs deepspeed runs in a subprocess (torchrun for training, `ds_reference.py` for the
reference state dict, the checkpoint's own `zero_to_torch.py`), so this process never imports deepspeed:
if inspector ever leaned on deepspeed being importable (e.g. through `torch.load(weights_only=False)`), the
tests would notice. Builds are serialised with a file lock (each torchrun uses both cores) and cached under
`$ZI_INTEROP_CACHE`, or a pytest tmp dir shared by xdist workers, keyed by a hash of everything that feeds
them. Set `ZI_INTEROP_STRICT=1` to fail, instead of skip, tests whose inspector command is not written yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
if str(REPO_ROOT) not in sys.path:  # so `import inspector` works however pytest was started
    sys.path.insert(0, str(REPO_ROOT))

from tests.conftest import cli_env  # noqa: E402  (the repository is on the path only from here)

BUILD_TIMEOUT = 600
STRICT = os.environ.get("ZI_INTEROP_STRICT", "") not in ("", "0")


@dataclass(frozen=True)
class Config:
    """One real checkpoint: the ds_train.py options that produce it and what DeepSpeed can read back."""

    name: str
    stage: int
    dtype: str = "bf16"
    world_size: int = 2
    frozen: bool = False
    tied: bool = False
    groups: int = 1
    bf16_optimizer: bool = False
    round_robin: bool = False
    param_alignment: bool = False
    sub_group_size: int = 0
    grad_accum: int = 1
    scale_power: int = 0  # fp16 initial_scale_power; high values make the first steps overflow (skipped)
    steps: int = 0

    def train_args(self) -> list[str]:
        args = ["--stage", str(self.stage), "--dtype", self.dtype, "--groups", str(self.groups)]
        flags = {
            "--frozen": self.frozen,
            "--tied": self.tied,
            "--bf16-optimizer": self.bf16_optimizer,
            "--round-robin": self.round_robin,
            "--param-alignment": self.param_alignment,
        }
        args += [f for f, on in flags.items() if on]
        if self.sub_group_size:
            args += ["--sub-group-size", str(self.sub_group_size)]
        if self.grad_accum != 1:
            args += ["--grad-accum", str(self.grad_accum)]
        if self.scale_power:
            args += ["--scale-power", str(self.scale_power)]
        if self.steps:
            args += ["--steps", str(self.steps)]
        return args

    @property
    def zero_to_fp32_drops_frozen(self) -> bool:
        """FORMAT.md 3.3: stage-1 frozen params exist only in `module`, and zero_to_fp32 skips them."""
        return self.stage == 1 and self.frozen


def _rich(name: str, stage: int, world_size: int = 2) -> Config:
    """bf16 with frozen params, a tied weight and two param groups: the layouts most likely to go wrong."""
    return Config(name, stage, world_size=world_size, frozen=True, tied=True, groups=2)


CONFIGS: dict[str, Config] = {
    c.name: c
    for c in [
        _rich("s1_bf16", 1),
        _rich("s2_bf16", 2),
        _rich("s3_bf16", 3),
        Config("s1_fp16", 1, "fp16"),
        Config("s2_fp16", 2, "fp16"),
        Config("s3_fp16", 3, "fp16"),
        Config("s2_fp32", 2, "fp32"),
        _rich("s1_bf16_ws3", 1, world_size=3),
        _rich("s2_bf16_ws3", 2, world_size=3),
        _rich("s3_bf16_ws3", 3, world_size=3),
        Config("bf16_optimizer", 1, bf16_optimizer=True, frozen=True, tied=True),
        Config("s2_round_robin", 2, round_robin=True),
        Config("s2_align_round_robin", 2, param_alignment=True, round_robin=True),
        Config("s3_sub_group", 3, sub_group_size=300),
        # for the module-copy proof (issue 9): fp16 runs whose first steps overflow and are skipped, and
        # gradient accumulation, with frozen and tied params
        Config("s2_fp16_overflow", 2, "fp16", frozen=True, tied=True, scale_power=18, steps=8),
        Config("s1_fp16_overflow_accum", 1, "fp16", frozen=True, tied=True, scale_power=18, steps=8, grad_accum=2),
        Config("s2_bf16_accum", 2, frozen=True, tied=True, groups=2, grad_accum=4),
    ]
}


@dataclass(frozen=True)
class Built:
    """A finished checkpoint: `root` is the directory holding `latest`."""

    config: Config
    root: Path
    workdir: Path
    seconds: float


@dataclass(frozen=True)
class Reference:
    """DeepSpeed's reconstruction (ds_reference.py): trainable fp32, frozen 16-bit, floating buffers fp32."""

    stage: int
    world_size: int
    tag: str
    ds_version: str
    compute_dtype: Any  # torch.dtype
    bf16_optimizer: bool
    files: tuple[str, ...]
    tensors: dict[str, Any]  # name -> torch.Tensor
    module: dict[str, Any]  # the 16-bit module copy (stage 3: buffers only)
    kinds: dict[str, str]
    aliases: dict[str, str]
    sources: dict[str, str]
    checks: dict[str, str] = field(default_factory=dict)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interop: tests against checkpoints written by real DeepSpeed (slow)")
    config.addinivalue_line("markers", "configs(*names): run this test only for these interop configs")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip this directory when deepspeed is missing.

    Like pytest.importorskip, but without importing deepspeed into the test process (see the module
    docstring), and from a hook because a module-level skip in a conftest named on the command line
    (`pytest tests/interop`) aborts the whole run instead of skipping.
    """
    if importlib.util.find_spec("deepspeed") is not None:
        return
    skip = pytest.mark.skip(reason="deepspeed is not installed; interop tests need real DeepSpeed")
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(skip)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize any test taking `config` over the matrix, or over `@pytest.mark.configs(...)`."""
    if "config" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("configs")
    names = list(marker.args) if marker else list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown interop configs {unknown}")
    metafunc.parametrize("config", names)


_BUILD_LOG: list[tuple[str, str, float]] = []  # (what, name, seconds) for the terminal summary


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _BUILD_LOG:
        return
    terminalreporter.section("interop builds")
    for what, name, seconds in _BUILD_LOG:
        terminalreporter.write_line(f"{what:<13} {name:<22} {seconds:6.1f} s")
    total = sum(s for _, _, s in _BUILD_LOG)
    terminalreporter.write_line(f"{'total':<36} {total:6.1f} s")


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:12]


def _free_port() -> int:
    """A port that is free now; torchrun binds it a moment later, so collisions are very unlikely."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ds_env() -> dict[str, str]:
    """Environment for subprocesses that import deepspeed: CPU accelerator, one OMP thread per rank."""
    env = dict(os.environ)
    env["DS_ACCELERATOR"] = "cpu"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def _heavy_lock(cache: Path) -> Iterator[None]:
    """One heavy job (torchrun or a deepspeed subprocess) at a time, across xdist workers too."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".heavy.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_logged(cmd: list[str], log: Path, what: str, timeout: float = BUILD_TIMEOUT) -> None:
    """Run in a new session so a timeout or Ctrl-C can kill torchrun *and* its rank processes."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=ds_env(), start_new_session=True
        )
        try:
            returncode = proc.wait(timeout=timeout)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)  # only the group this call started
            proc.wait()
            raise
    if returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{what} failed (exit {returncode}); log {log}:\n{tail}")


class _Factory:
    """Builds checkpoints and references on demand; remembers failures so one bad build fails fast."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.built: dict[str, Built] = {}
        self.refs: dict[str, Reference] = {}
        self.failed: dict[str, str] = {}
        versions = "|".join(importlib.metadata.version(p) for p in ("deepspeed", "torch"))
        self.train_key = _sha((HERE / "ds_train.py").read_bytes(), versions)
        self.ref_key = _sha((HERE / "ds_reference.py").read_bytes(), versions)
        self.resume_key = _sha((HERE / "ds_resume.py").read_bytes(), versions)

    def checkpoint(self, name: str) -> Built:
        if name in self.failed:
            pytest.fail(f"interop build {name} failed earlier:\n{self.failed[name]}", pytrace=False)
        if name not in self.built:
            try:
                self.built[name] = self._build(CONFIGS[name])
            except Exception as exc:  # remembered, so later tests fail fast
                self.failed[name] = str(exc)
                raise
        return self.built[name]

    def _build(self, cfg: Config) -> Built:
        work = self.cache / f"{cfg.name}-{_sha(self.train_key, *cfg.train_args(), str(cfg.world_size))}"
        root, stamp = work / "ckpt", work / "build.json"
        with _heavy_lock(self.cache):
            if stamp.exists():
                return Built(cfg, root, work, json.loads(stamp.read_text())["seconds"])
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            cmd = [
                str(Path(sys.executable).with_name("torchrun")),
                "--nproc_per_node",
                str(cfg.world_size),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(_free_port()),
                str(HERE / "ds_train.py"),
                str(root),
                *cfg.train_args(),
            ]
            if not Path(cmd[0]).exists():
                cmd[0:1] = [sys.executable, "-m", "torch.distributed.run"]
            t0 = time.monotonic()
            _run_logged(cmd, work / "build.log", f"torchrun build of {cfg.name}")
            seconds = time.monotonic() - t0
            if not (root / "latest").is_file():
                raise RuntimeError(f"build of {cfg.name} wrote no `latest` file under {root}")
            stamp.write_text(
                json.dumps({"seconds": seconds, "args": cfg.train_args(), "world_size": cfg.world_size})
            )
        _BUILD_LOG.append(("checkpoint", cfg.name, seconds))
        return Built(cfg, root, work, seconds)

    def reference(self, name: str) -> Reference:
        if f"reference {name}" in self.failed:
            pytest.fail(
                f"DeepSpeed reference for {name} failed earlier:\n{self.failed[f'reference {name}']}",
                pytrace=False,
            )
        if name not in self.refs:
            try:
                self.refs[name] = self._reference(name)
            except Exception as exc:  # remembered, so later tests fail fast
                self.failed[f"reference {name}"] = str(exc)
                raise
        return self.refs[name]

    def _reference(self, name: str) -> Reference:
        built = self.checkpoint(name)
        out = built.workdir / f"reference-{self.ref_key}.pt"
        with _heavy_lock(self.cache):
            if not out.exists():
                t0 = time.monotonic()
                _run_logged(
                    [sys.executable, str(HERE / "ds_reference.py"), str(built.root), str(out)],
                    built.workdir / "reference.log",
                    f"DeepSpeed reference for {name}",
                )
                _BUILD_LOG.append(("reference", name, time.monotonic() - t0))
        raw = torch.load(out, map_location="cpu", weights_only=True)
        return Reference(
            stage=raw["stage"],
            world_size=raw["world_size"],
            tag=raw["tag"],
            ds_version=raw["ds_version"],
            compute_dtype=getattr(torch, raw["compute_dtype"]),
            bf16_optimizer=raw["bf16_optimizer"],
            files=tuple(raw["files"]),
            tensors=dict(raw["tensors"]),
            module=dict(raw["module"]),
            kinds=dict(raw["kinds"]),
            aliases=dict(raw["aliases"]),
            sources=dict(raw["sources"]),
            checks=dict(raw["checks"]),
        )

    def zero_to_torch(self, name: str, dtype: str) -> Path:
        """The checkpoint's own `zero_to_torch.py ROOT OUT --dtype X --safe_serialization` output dir."""
        if importlib.util.find_spec("huggingface_hub") is None:
            pytest.skip("zero_to_torch.py always shards through huggingface_hub, which is not installed")
        built = self.checkpoint(name)
        if not (built.root / "zero_to_torch.py").is_file():
            pytest.skip("this DeepSpeed predates zero_to_torch.py (added after 0.19.5)")
        out = built.workdir / f"zero_to_torch-{dtype}"
        with _heavy_lock(self.cache):
            if not (out / ".done").exists():
                shutil.rmtree(out, ignore_errors=True)
                t0 = time.monotonic()
                _run_logged(
                    [
                        sys.executable,
                        str(built.root / "zero_to_torch.py"),
                        str(built.root),
                        str(out),
                        "--dtype",
                        dtype,
                        "--safe_serialization",
                    ],
                    built.workdir / f"zero_to_torch-{dtype}.log",
                    f"zero_to_torch.py for {name}",
                )
                (out / ".done").write_text("")
                _BUILD_LOG.append(("zero_to_torch", name, time.monotonic() - t0))
        return out

    def universal(self, name: str, which: str) -> Path:
        """A root holding `latest_universal`: ours (`convert --format universal`) or DeepSpeed's
        (`ds_to_universal --inject_missing_state`), converted from checkpoint `name`."""
        built = self.checkpoint(name)
        out = built.workdir / f"universal-{which}"
        with _heavy_lock(self.cache):
            if not (out / ".done").exists():
                shutil.rmtree(out, ignore_errors=True)
                tag = (built.root / "latest").read_text().strip()
                t0 = time.monotonic()
                if which == "ours":
                    cmd = [sys.executable, "-m", "inspector", "convert", str(built.root), str(out)]
                    cmd += ["--format", "universal"]
                else:
                    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder"]
                    cmd += [str(built.root / tag), "--output_folder", str(out / f"{tag}_uni")]
                    cmd += ["--inject_missing_state"]
                    out.mkdir(parents=True)
                _run_logged(cmd, built.workdir / f"universal-{which}.log", f"universal ({which}) of {name}")
                (out / ".done").write_text("")
                _BUILD_LOG.append((f"uni-{which}", name, time.monotonic() - t0))
        return out

    def resume(self, name: str, which: str, world_size: int) -> dict[str, Any]:
        """What real DeepSpeed holds after `load_checkpoint` with `load_universal` on `world_size` ranks
        (ds_resume.py), plus the loss of one more training step."""
        built = self.checkpoint(name)
        root = self.universal(name, which)
        out = built.workdir / f"resume-{which}-ws{world_size}-{self.resume_key}.pt"
        with _heavy_lock(self.cache):
            if not out.exists():
                t0 = time.monotonic()
                cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", str(world_size)]
                cmd += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port())]
                cmd += [str(HERE / "ds_resume.py"), str(root), *built.config.train_args(), str(out)]
                log = built.workdir / f"resume-{which}-ws{world_size}.log"
                _run_logged(cmd, log, f"resume of {name} from {which} on {world_size} ranks")
                _BUILD_LOG.append((f"resume-{which}", f"{name} ws{world_size}", time.monotonic() - t0))
        return dict(torch.load(out, map_location="cpu", weights_only=True))

    def live(self, name: str) -> dict[str, Any]:
        """The training engine's own state right after save_checkpoint (ds_train.py writes it)."""
        path = self.checkpoint(name).workdir / "live.pt"
        return dict(torch.load(path, map_location="cpu", weights_only=True))


@pytest.fixture(scope="session")
def interop_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`$ZI_INTEROP_CACHE`, else a session tmp dir (the xdist parent dir, so workers share builds)."""
    if env := os.environ.get("ZI_INTEROP_CACHE"):
        path = Path(env)
    else:
        base = tmp_path_factory.getbasetemp()
        path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "zi_interop_cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def _factory(interop_cache: Path) -> _Factory:
    return _Factory(interop_cache)


@pytest.fixture(scope="session")
def ds_checkpoint(_factory: _Factory) -> Callable[[str], Built]:
    """Factory: config name -> a real DeepSpeed checkpoint, built with torchrun on first use."""
    return _factory.checkpoint


@pytest.fixture(scope="session")
def reference(_factory: _Factory) -> Callable[[str], Reference]:
    """Factory: config name -> DeepSpeed's own reconstruction of that checkpoint (see ds_reference.py)."""
    return _factory.reference


@pytest.fixture(scope="session")
def zero_to_torch(_factory: _Factory) -> Callable[[str, str], Path]:
    """Factory: (config name, dtype) -> output dir of the checkpoint's own zero_to_torch.py."""
    return _factory.zero_to_torch


def run_inspector(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m inspector ARGS` from the repo under test; wide, colourless output so nothing wraps."""
    return subprocess.run(
        [sys.executable, "-m", "inspector", *args],
        check=False,
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=timeout,
        cwd=REPO_ROOT,
    )


@pytest.fixture(scope="session")
def inspector_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs `python -m inspector ...` in a subprocess (see `run_inspector`)."""
    return run_inspector


def _not_ready(reason: str) -> None:
    if STRICT:
        pytest.fail(f"{reason} (ZI_INTEROP_STRICT is set)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def _command_probe() -> Callable[[str], None]:
    """Skips (or fails with ZI_INTEROP_STRICT) when an inspector subcommand does not exist yet."""
    seen: dict[str, str | None] = {}

    def probe(command: str) -> None:
        if command not in seen:
            if not (REPO_ROOT / "inspector" / "__main__.py").exists():
                seen[command] = "inspector/__main__.py is not written yet"
            else:
                proc = run_inspector(command, "--help", timeout=120)
                seen[command] = (
                    None
                    if proc.returncode == 0
                    else (
                        f"`python -m inspector {command} --help` exited {proc.returncode}: "
                        f"{(proc.stderr or proc.stdout).strip()[-500:]}"
                    )
                )
        if (reason := seen[command]) is not None:
            _not_ready(reason)

    return probe


@pytest.fixture
def require_command(_command_probe: Callable[[str], None]) -> Callable[[str], None]:
    """Call with a subcommand name at the top of a test that drives the CLI."""
    return _command_probe


def require_module(module: str) -> None:
    """Skip while `inspector/<module>.py` is not written yet; once it exists an import error is a failure."""
    rel = Path(*module.split(".")).with_suffix(".py")
    if not (REPO_ROOT / rel).exists() and not (REPO_ROOT / rel.with_suffix("") / "__init__.py").exists():
        _not_ready(f"{rel} is not written yet")


@pytest.fixture(scope="session")
def inspector_api() -> Any:
    """`(scan, read_tensor)` from the package under test; skips while those modules are not written."""
    require_module("inspector.scan.scanner")
    require_module("inspector.convert.reader")
    from inspector.convert.reader import read_tensor
    from inspector.format.dtypes import torch_dtype
    from inspector.scan.scanner import scan  # imported late: collection must not need it

    def read_tensor_torch(*args: Any, **kwargs: Any) -> torch.Tensor:
        """inspector's reader returns numpy (no torch on its path); the tests compare torch tensors."""
        a = read_tensor(*args, **kwargs)
        if a.size == 0:
            return torch.empty(a.shape, dtype=torch_dtype(str(a.dtype)))
        raw = torch.from_numpy(a.reshape(-1).view("uint8").copy())
        return raw.view(torch_dtype(str(a.dtype))).reshape(a.shape)

    return scan, read_tensor_torch


@pytest.fixture(scope="session")
def universal_resume(_factory: _Factory) -> Callable[[str, str, int], dict[str, Any]]:
    """Factory: (config, "ours" | "theirs", world size) -> DeepSpeed's state after a universal resume."""
    return _factory.resume


@pytest.fixture(scope="session")
def live_state(_factory: _Factory) -> Callable[[str], dict[str, Any]]:
    """Factory: config -> the training engine's fp32 masters, moments and steps at save time."""
    return _factory.live


@pytest.fixture(scope="session")
def universal_root(_factory: _Factory) -> Callable[[str, str], Path]:
    """Factory: (config, "ours" | "theirs") -> a root holding latest_universal and its folder."""
    return _factory.universal


# Hugging Face Trainer runs (hf_train.py): shared by test_hf_interop.py and test_tui_interop.py
RUNS = {
    "lora_zero3": ["--stage", "3", "--lora"],
    "full": ["--stage", "3"],
    "lora": ["--stage", "2", "--lora"],
    "rslora": ["--stage", "2", "--lora", "--rslora"],
}


def _need(module: str) -> Any:
    return pytest.importorskip(module, reason=f"{module} is in the interop extra")


@pytest.fixture(scope="session")
def hf_run(interop_cache: Path) -> Callable[[str], Path]:
    """Run name -> work folder (run/checkpoint-N, base/, tokenizer/, reference.pt), trained once and cached."""
    _need("transformers")
    _need("peft")
    versions = "|".join(importlib.metadata.version(p) for p in ("deepspeed", "torch", "transformers", "peft"))
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name in built:
            return built[name]
        args = RUNS[name]
        work = interop_cache / f"hf-{name}-{_sha((HERE / 'hf_train.py').read_bytes(), versions, *args)}"
        with _heavy_lock(interop_cache):
            if not (work / "build.json").exists():
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                torchrun = Path(sys.executable).with_name("torchrun")
                cmd = [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
                cmd += ["--master_port", str(_free_port()), str(HERE / "hf_train.py"), str(work), *args]
                t0 = time.monotonic()
                _run_logged(cmd, work / "build.log", f"Trainer run {name}")
                ckpt = next((work / "run").glob("checkpoint-*"))
                _run_logged(
                    [sys.executable, str(HERE / "ds_reference.py"), str(ckpt), str(work / "reference.pt")],
                    work / "reference.log",
                    f"DeepSpeed reference for Trainer run {name}",
                )
                (work / "build.json").write_text(json.dumps({"seconds": time.monotonic() - t0}))
        built[name] = work
        return work

    return build
