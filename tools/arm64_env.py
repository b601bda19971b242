"""Builds an emulated arm64 Python for tests/test_arm64_model.py: Debian's aarch64 CPython and the model path's
packages (torch's aarch64 wheel, transformers, ...), run under qemu-user on an x86-64 host.

    .venv/bin/python tools/arm64_env.py [--out DIR]     (default ~/.cache/edgeinspect/arm64-env, ~1.3 GB)

DIR/root holds python3.11 and the shared libraries it and torch load, from Debian bookworm's arm64 packages: the
release file's signature is checked against the host's Debian archive keyring, then every package's SHA-256, before
anything is unpacked (no package is installed on the host, no foreign architecture is added). DIR/site holds the
wheels, installed for aarch64 by this environment's pip. torch is 2.10.0, the newest aarch64 wheel on PyPI that is
a CPU build (from 2.11 on PyPI's aarch64 wheels depend on CUDA packages); the rest (transformers, ONNX Runtime and
the ONNX exporter's packages, pydantic for the vision node's settings, ...) take the versions installed here. DIR/site
is rebuilt when that list changes (its .complete file holds the list).
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from importlib.metadata import version
from pathlib import Path

MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# What the interpreter, its standard library and torch's libraries need; their dependencies are added from the index.
DEBIAN_PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libc6", "libgcc-s1", "libstdc++6", "libgomp1")
NOT_NEEDED = {"debconf", "debconf-2.0", "perl-base", "dpkg", "tzdata", "media-types", "netbase", "readline-common"}
TORCH = "torch==2.10.0"
SAME_AS_HERE = (
    *("transformers", "tokenizers", "safetensors", "numpy", "pillow", "PyYAML"),
    *("onnxruntime", "onnx", "onnxscript", "onnx-ir", "ml_dtypes", "protobuf"),  # the vision node's default backend
    *("pydantic", "pydantic-settings"),  # its settings
    "opencv-python-headless",  # the int8 copy's check frames are drawn with OpenCV (models/vision_int8.py)
)
AARCH64 = ["--platform", "manylinux_2_28_aarch64", "--platform", "manylinux_2_17_aarch64", "--python-version", "3.11"]


def default_dir() -> Path:
    return Path.home() / ".cache" / "edgeinspect" / "arm64-env"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        return response.read()


def _fields(stanza: str) -> dict[str, str]:
    out = {}
    for line in stanza.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, value = line.split(":", 1)
            out[key] = value.strip()
    return out


def _packages_index(folder: Path) -> dict[str, dict[str, str]]:
    """The arm64 main index of the suite, verified: the InRelease signature (gpgv) and the index's SHA-256 in it."""
    release = folder / "InRelease"
    release.write_bytes(_get(f"{MIRROR}/dists/{SUITE}/InRelease"))
    subprocess.run(["gpgv", "--keyring", KEYRING, str(release)], check=True, capture_output=True)
    name = "main/binary-arm64/Packages.xz"
    listed = re.search(rf"^ ([0-9a-f]{{64}}) +\d+ {re.escape(name)}$", release.read_text(), re.M)
    if listed is None:
        raise SystemExit(f"{name} is not listed in the signed release file")
    data = _get(f"{MIRROR}/dists/{SUITE}/{name}")
    if hashlib.sha256(data).hexdigest() != listed.group(1):
        raise SystemExit(f"{name}: SHA-256 differs from the signed release file")
    index: dict[str, dict[str, str]] = {}
    for stanza in lzma.decompress(data).decode().split("\n\n"):
        fields = _fields(stanza)
        if "Package" in fields:
            index.setdefault(fields["Package"], fields)
    return index


def _closure(index: dict[str, dict[str, str]]) -> list[str]:
    """DEBIAN_PACKAGES and what they depend on (the first of alternatives), less what a plain chroot never runs."""
    order: list[str] = []
    todo = list(DEBIAN_PACKAGES)
    while todo:
        name = todo.pop()
        if name in order or name in NOT_NEEDED:
            continue
        if name not in index:
            raise SystemExit(f"{name} is not in {SUITE}'s arm64 index")
        order.append(name)
        for field in ("Pre-Depends", "Depends"):
            for dep in filter(None, (d.strip() for d in index[name].get(field, "").split(","))):
                todo.append(re.split(r"[ (:]", dep.split("|")[0].strip())[0])
    return order


def build_root(root: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        index = _packages_index(folder)
        names = _closure(index)
        print(f"unpacking {len(names)} Debian arm64 packages into {root}", flush=True)
        for name in names:
            data = _get(f"{MIRROR}/{index[name]['Filename']}")
            if hashlib.sha256(data).hexdigest() != index[name]["SHA256"]:
                raise SystemExit(f"{name}: SHA-256 differs from the signed index")
            deb = folder / f"{name}.deb"
            deb.write_bytes(data)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)


def same_as_here() -> list[str]:
    return [f"{name}=={version(name)}" for name in SAME_AS_HERE]


def build_site(site: Path) -> None:
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), "--only-binary=:all:", *AARCH64]
    print(f"installing {TORCH} (aarch64) and the model path's packages into {site}", flush=True)
    # pip evaluates torch's dependency markers for this host, not the target: its own dependencies go in by name.
    subprocess.run([*pip, "--no-deps", TORCH], check=True)
    torch_needs = ["filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec"]
    subprocess.run([*pip, "--upgrade", *torch_needs, *same_as_here()], check=True)  # --upgrade: into torch's folder too


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=default_dir(), help="the folder to build (default: %(default)s)")
    args = ap.parse_args()
    # Each part's .complete holds what it was built from; a root built before that was written holds nothing.
    parts = (("root", build_root, (SUITE, "")), ("site", build_site, (" ".join([TORCH, *same_as_here()]),)))
    for part, build, stamps in parts:
        target, done = args.out / part, args.out / part / ".complete"
        if done.exists() and done.read_text() in stamps:
            print(f"{target}: already built", flush=True)
            continue
        if target.exists():
            print(f"{target}: built from another list than this one, rebuilding", flush=True)
            shutil.rmtree(target)
        target.mkdir(parents=True)
        build(target)
        done.write_text(stamps[0])
    print(f"arm64 environment ready: {args.out}")


if __name__ == "__main__":
    main()
