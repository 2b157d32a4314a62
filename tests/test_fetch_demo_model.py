"""scripts/fetch_demo_model.py's own options: --help answers (it was taken for OUT_DIR, and the
538 MB checkpoint written into ./--help), and a directory that is not a whole checkpoint is refused."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fetch_demo_model.py"


def run(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_help_writes_nothing(tmp_path):
    out = run("--help", cwd=tmp_path)
    assert out.returncode == 0 and "usage:" in out.stdout and "out_dir" in out.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_is_not_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    out = run(str(tmp_path / "mine"), cwd=tmp_path)
    assert out.returncode == 1 and "exists but is not a whole checkpoint" in out.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
