"""Build libtrtllm_cpu.so: `python -m trtllm.plugins.cpu.build [--force]`.

ONNX Runtime's PyPI wheel ships no C headers, so they come from Debian's libonnxruntime-dev package
(pinned by SHA-256, fetched once into build/ort-headers). The custom-op ABI is versioned: a library
built against the 1.21 headers asks the runtime for API version 21, which every later ONNX Runtime
provides. The compiler is the system's g++ (C++17). The library is rebuilt when what it is built from
changes (a SHA-256 of the sources, headers, this script, then the library's own and $CXX, kept next
to it), not when a file is newer: a checkout of older sources leaves older times. A library out of
step with its sources is not used (trtllm.plugins.cpu.library()).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from trtllm.plugins.cpu import LIBRARY, compiler_name

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / name for name in ("matmul.cc", "matmul_avx2.cc", "matmul_int8.cc", "matmul_int8_avx2.cc",
                                     "matmul_block_quant.cc", "matmul_half.cc", "attention.cc", "attention_avx2.cc",
                                     "segment_attention.cc", "lora.cc", "sample.cc", "moe.cc", "mamba.cc",
                                     "register.cc")]
HEADERS = [HERE / "common.h", HERE / "resident.h", HERE / "matmul.h", HERE / "attention.h"]
ROOT = HERE.parent.parent
HEADERS_DEB = ("https://deb.debian.org/debian/pool/main/o/onnxruntime/libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb",
               "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08")
HEADER = "onnxruntime_cxx_api.h"


def ar_members(blob: bytes):
    """The members of a .deb (a Unix ar archive): (name, data)."""
    if not blob.startswith(b"!<arch>\n"):
        raise RuntimeError("not an ar archive")
    pos = 8
    while pos + 60 <= len(blob):
        header = blob[pos:pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        yield name, blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)


def fetch_headers(dest: Path) -> Path:
    """dest/onnxruntime/*.h from the pinned Debian package; returns the include directory."""
    include = dest / "onnxruntime"
    if (include / HEADER).is_file():
        return include
    url, sha = HEADERS_DEB
    print(f"[cpu kernels] fetching ONNX Runtime headers: {url}", file=sys.stderr)
    blob = urllib.request.urlopen(url, timeout=120).read()
    if hashlib.sha256(blob).hexdigest() != sha:
        raise RuntimeError(f"{url}: SHA-256 mismatch (expected {sha})")
    data = next(d for n, d in ar_members(blob) if n.startswith("data.tar"))
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and "/usr/include/onnxruntime/" in m.name]
        for m in members:
            rel = m.name.split("/usr/include/", 1)[1]
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(tar.extractfile(m).read())
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return include


def compile_library(include: Path, out: Path = LIBRARY) -> Path:
    cxx = compiler_name()
    digest = source_digest()  # of the sources as they are compiled (one edited meanwhile is not stamped)
    tmp = out.with_name(out.name + ".partial")
    # -Wno-uninitialized: GCC 12's own AVX-512 headers trip it (`__m256d __Y = __Y;` in _mm512_reduce_add_ps).
    cmd = [cxx, "-std=c++17", "-O3", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wno-uninitialized",
           f"-I{include}", *map(str, SOURCES), "-o", str(tmp)]
    print("[cpu kernels] " + " ".join(cmd), file=sys.stderr)
    try:
        subprocess.run(cmd, check=True)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)  # a failed compile never replaces a good library
    stamp = stamp_of(out)
    stamp.with_name(stamp.name + ".partial").write_text(f"{digest}\n{library_digest(out)}\n{cxx}\n")
    os.replace(stamp.with_name(stamp.name + ".partial"), stamp)  # written last: a crash before it rebuilds
    return out


def stamp_of(out: Path) -> Path:
    return out.with_name(out.name + ".sha256")


def source_digest() -> str:
    """SHA-256 of what the library is built from: sources, headers and this script."""
    digest = hashlib.sha256()
    for path in [*SOURCES, *HEADERS, Path(__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def library_digest(out: Path) -> str:
    """The library's own SHA-256 and size: a truncated or damaged copy (an interrupted copy to a
    device) is not handed to ONNX Runtime, which dies on it without a word (SIGBUS)."""
    data = out.read_bytes()
    return f"{hashlib.sha256(data).hexdigest()} {len(data)}"


def needs_build(out: Path = LIBRARY, compiler: bool = True) -> bool:
    """Whether the library is missing, damaged, or built from other sources; `compiler`: or with
    another $CXX (its name, not its version: a new g++ does not rebuild; --force does). At run time
    (`compiler` False) the build's compiler does not matter: $CXX is the shell's, not the library's."""
    stamp = stamp_of(out)
    if not (out.is_file() and stamp.is_file()):
        return True
    want = [source_digest(), library_digest(out)] + ([compiler_name()] if compiler else [])
    return stamp.read_text().splitlines()[:len(want)] != want


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the library is up to date")
    parser.add_argument("--headers", type=Path, default=ROOT / "build" / "ort-headers",
                        help="where the ONNX Runtime headers are (fetched there when missing)")
    args = parser.parse_args(argv)
    if not args.force and not needs_build():
        print(f"[cpu kernels] {LIBRARY} is up to date", file=sys.stderr)
        return 0
    cxx = compiler_name()
    if shutil.which(cxx) is None:  # (before the headers' download, which would be for nothing)
        print(f"[cpu kernels] no C++ compiler: {cxx} is not on PATH (apt-get install g++, or set $CXX); the "
              "kernels are optional: engines run on ONNX Runtime's own", file=sys.stderr)
        return 1
    compile_library(fetch_headers(args.headers))
    print(f"[cpu kernels] built {LIBRARY}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
