"""`tox -e package`: build the sdist and the wheel as a release would, read what they carry, install the wheel
into a fresh venv and run the installed command there (the version, a demo, a scan, the no-terminal refusal).

Run from the repository root with `build` installed; it fails (non-zero, saying what) on the first problem.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fail(what: str) -> None:
    sys.exit(f"package check: {what}")


def version() -> str:
    m = re.search(r'^__version__ = "([^"]+)"', (ROOT / "inspector" / "__init__.py").read_text(), re.M)
    return m.group(1) if m else ""


def check_wheel(wheel: Path, want: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        fail(f"{wheel.name} carries no LICENSE")
    if "License-Expression: Apache-2.0" not in meta:
        fail("METADATA has no License-Expression: Apache-2.0")
    if f"\nVersion: {want}\n" not in meta:
        fail(f"METADATA's version is not {want} (inspector/__init__.py)")
    if any(not n.startswith(("inspector/", "zero_inspector-")) for n in names):
        fail(f"{wheel.name} carries files outside the package: {[n for n in names if '/' not in n]}")
    required = [
        line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    if any("safetensors" in line for line in required):
        fail("safetensors is a runtime dependency, but nothing imports it")


def check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as t:
        names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
    for need in ("LICENSE", "README.md", "pyproject.toml", "inspector/cli/main.py"):
        if need not in names:
            fail(f"{sdist.name} lacks {need}")
    if any(n.startswith("tests/") for n in names):
        fail(f"{sdist.name} carries the test suite's files")


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, **kw)  # type: ignore[call-overload]


def check_installed(wheel: Path, want: str, work: Path) -> None:
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True)
    pip = run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)])
    if pip.returncode:
        fail(f"pip install {wheel.name} failed:\n{pip.stderr[-2000:]}")
    exe = str(env_dir / "bin" / "zero-inspector")
    res = run([exe, "--version"], cwd=work)
    if res.returncode or res.stdout.strip() != f"zero-inspector {want}":
        fail(f"--version said {res.stdout!r} {res.stderr[-500:]!r}")
    demo = work / "demo"
    if run([exe, "demo", str(demo)], cwd=work).returncode:
        fail("demo failed")
    res = run([exe, "scan", str(demo), "--json"], cwd=work)
    if res.returncode or json.loads(res.stdout).get("stage") != 2:
        fail(f"scan --json of the demo failed: {res.stderr[-500:]}")
    res = run([exe, str(demo)], cwd=work, stdin=subprocess.DEVNULL)
    if res.returncode != 2 or "\x1b[?1049h" in res.stdout:
        fail("the app did not refuse without a terminal")
    print(f"package check: {wheel.name} installs and runs (version, demo, scan, no-terminal refusal)")


def main() -> None:
    want = version()
    with tempfile.TemporaryDirectory(prefix="zi-package-") as tmp:
        work = Path(tmp)
        built = run([sys.executable, "-m", "build", "--outdir", str(work / "dist"), str(ROOT)])
        if built.returncode:
            fail(f"python -m build failed:\n{built.stdout[-2000:]}{built.stderr[-2000:]}")
        (wheel,) = (work / "dist").glob("*.whl")
        (sdist,) = (work / "dist").glob("*.tar.gz")
        check_wheel(wheel, want)
        check_sdist(sdist)
        check_installed(wheel, want, work)


if __name__ == "__main__":
    main()
