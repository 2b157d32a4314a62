"""trtllm-run's stdout as a pipe, beyond test_run_cli.py's: a reader that goes away part-way
through a large answer."""
from __future__ import annotations

import json
import subprocess
import sys


def test_a_reader_gone_mid_answer_exits_141(tmp_path, tiny_engine):
    """`trtllm-run in.json | head -c 10` with an answer of several pipe buffers: the write is cut
    short after the first 64 KiB. Before, Python's buffered stdout dropped that error: the run
    exited 0 with the rest of the answer lost; now it ends as a program killed by SIGPIPE would."""
    payload = {"temperature": 0, "max_generate_length": 40, "ignore_eos": True, "num_logprobs": 50,
               "requests": [{"messages": [{"role": "user", "content": "a"}]}]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    proc = subprocess.Popen([sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine",
                             str(tiny_engine("llama"))], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert head.startswith(b'{') and "Traceback" not in err


def test_answers_on_stdout_are_utf8_whatever_the_locale(tmp_path, tiny_engine):
    """The JSON on stdout is UTF-8 (RFC 8259) under an ASCII locale too, as the --output file is."""
    payload = {"temperature": 0, "max_generate_length": 2,
               "requests": [{"messages": [{"role": "user", "content": "é 中 🙂"}]}]}
    (tmp_path / "in.json").write_text(json.dumps(payload), encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0"}
    proc = subprocess.run([sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine",
                           str(tiny_engine("llama"))], capture_output=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout.decode("utf-8"))
    assert out["responses"][0]["messages"][0]["content"][0]["text"] == "é 中 🙂"
