"""What code a build ran, for its check's report (verify.json): a check that fails while the sources
or the native kernel library were being edited or rebuilt under the build says so, instead of
looking like a numerical fault of the engine."""
from __future__ import annotations

import hashlib
from pathlib import Path

from trtllm.plugins import cpu as cpu_kernels

PACKAGE = Path(__file__).resolve().parent.parent  # trtllm: builder, runtime, plugins
PARTS = ("builder", "runtime", "plugins")


def code_fingerprint() -> str:
    """sha256 (16 hex digits) of the package's Python sources and the CPU kernel library as they
    are on disk now (a few MB read: milliseconds)."""
    digest = hashlib.sha256()
    files = sorted(p for part in PARTS for p in (PACKAGE / part).rglob("*.py"))
    for path in files + ([cpu_kernels.LIBRARY] if cpu_kernels.LIBRARY.is_file() else []):
        # (the library by its place in the package: LIBRARY may be reached through a symbolic link)
        name = f"plugins/cpu/{path.name}" if path == cpu_kernels.LIBRARY else str(path.relative_to(PACKAGE))
        digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
