"""The README's scripts where they decide something: test.sh's reading of test paths from the
caller's directory, setup.sh's care with a venv it did not make."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_paths_are_read_from_the_caller_s_directory_and_option_values_are_not_paths(tmp_path):
    loop = subprocess.run(["sed", "-n", "/^args=()/,/^done/p", str(ROOT / "scripts" / "test.sh")],
                          capture_output=True, text=True, check=True).stdout
    (tmp_path / "runtime").mkdir()
    (tmp_path / "test_x.py").write_text("")
    script = loop + 'printf "%s\\n" "${args[@]}"\n'
    given = ["-k", "runtime", "test_x.py::test_a", "--deselect", "test_x.py::test_b", "runtime", "-m", "not slow"]
    out = subprocess.run(["bash", "-c", script, "test.sh", *given], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["-k", "runtime", f"{tmp_path}/test_x.py::test_a", "--deselect", "test_x.py::test_b",
                   f"{tmp_path}/runtime", "-m", "not slow"]


def test_a_venv_setup_did_not_make_is_never_removed(tmp_path):
    """TRTLLM_VENV may name someone's environment (uv makes them without pip): setup stops, it
    does not remove it as a half-made one of its own."""
    venv = tmp_path / "theirs"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "MINE").write_text("keep")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "TRTLLM_VENV": str(venv)})
    assert result.returncode == 1 and "has no pip" in result.stderr, result.stderr
    assert (venv / "MINE").read_text() == "keep"
