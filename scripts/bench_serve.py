#!/usr/bin/env python3
"""trtllm-serve against llama.cpp's llama-server under concurrent load, side by side in one run.

    python scripts/bench_serve.py --llama-build ~/peers/llama.cpp/build-server --out serve.json

Each server is a subprocess of this one, started for its turn and stopped after it, with the same
thread count, the same number of parallel slots and the same requests: C clients at once, each
sending R streamed chat requests one after the other (prompts that differ after the chat
template's default system prompt, none asked twice of a server), greedy, EOS ignored, exactly
--max-tokens new tokens each (checked: a request that fails or streams another number of text
chunks stops the benchmark). Figures per C: the whole
load's generated tokens per second (wall clock from the first request to the last answer) and
the median time to the first token (to the first chunk with text). Every round runs each
system once per C, every other round in the reverse order; ratios (ours / llama-server's, > 1
is better for ours: its rate over theirs, their TTFT over ours) are paired by round and given as
the median and range. Results to --out (JSON).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = Path(os.environ.get("PEERS_DIR", Path.home() / "peers"))
TOPICS = ["a lighthouse", "a lost key", "the first snow", "a robot gardener", "an old map", "a night train",
          "a quiet library", "a paper boat", "the last bus", "a clockmaker", "a desert well", "a red kite",
          "a sleeping volcano", "a hidden door", "a jazz club", "a mountain hut"]


def server_commands(args, port: int) -> dict[str, list[str]]:
    slots, threads = str(args.slots), str(args.threads)
    ours = [str(ROOT / ".venv" / "bin" / "trtllm-serve"), "--engine", str(args.engine), "--port", str(port),
            "--threads", threads, "--batch-size", slots, "--quiet"]
    llama = [str(args.llama_build / "bin" / "llama-server"), "-m", str(args.gguf), "--port", str(port),
             "-t", threads, "-tb", threads, "-np", slots, "-c", str(args.slots * args.context_per_slot),
             "--no-webui", "--log-disable"]
    return {"trtllm-serve": ours, "llama-server": llama}


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_ready(port: int, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the server did not come up")


def one_request(port: int, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to the first text, seconds in all, chunks with text) of one streamed request."""
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:500]!r}")
    first, pieces = None, 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            if choice.get("delta", {}).get("content"):
                pieces += 1
                first = first or time.perf_counter() - t0
    c.close()
    return first or float("nan"), time.perf_counter() - t0, pieces


def prompt(clients: int, k: int, j: int) -> str:
    """Client k's j-th prompt at this load: none asked twice of one server (each caches prompts)."""
    return f"Write a short story about {TOPICS[(k * 7 + j) % len(TOPICS)]}, number {clients}-{k}-{j}."


def load(port: int, clients: int, per_client: int, max_tokens: int) -> dict:
    results, errors, start = [], [], time.perf_counter()

    def client(k: int) -> None:
        try:
            for j in range(per_client):
                results.append(one_request(port, prompt(clients, k, j), max_tokens))
        except Exception as e:  # noqa: BLE001 - said below, for the whole load
            errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    short = [r[2] for r in results if r[2] != max_tokens]
    if errors or short:
        raise RuntimeError(f"C={clients}: {errors[:1] or ''} {len(short)} answers of another length: {short[:4]}")
    tokens = clients * per_client * max_tokens
    return {"clients": clients, "requests": len(results), "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_ms": 1000 * statistics.median(r[0] for r in results), "text_chunks": sum(r[2] for r in results)}


def run_system(name: str, command: list[str], port: int, args) -> list[dict]:
    if listening(port):
        raise RuntimeError(f"something listens on port {port} already: give --port another")
    with tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(port, proc, Path(log.name))
            one_request(port, "Write a short story about a warm-up.", 8)
            return [{"system": name, **load(port, c, args.requests_per_client, args.max_tokens)} for c in args.clients]
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def ratios(rounds: list[list[dict]], clients: list[int]) -> dict:
    out = {}
    for c in clients:
        rate, ttft = [], []
        for rows in rounds:
            by = {r["system"]: r for r in rows if r["clients"] == c}
            rate.append(by["trtllm-serve"]["tokens_per_s"] / by["llama-server"]["tokens_per_s"])
            ttft.append(by["llama-server"]["ttft_ms"] / by["trtllm-serve"]["ttft_ms"])
        out[str(c)] = {"tokens_per_s": [statistics.median(rate), min(rate), max(rate)],
                       "ttft": [statistics.median(ttft), min(ttft), max(ttft)]}
    return out


def interrupted(signum, frame):
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=ROOT / "engines" / "smollm2-135m-instruct")
    parser.add_argument("--gguf", type=Path, default=PEERS_DIR / "gguf" / "smollm2-135m-instruct-f32.gguf")
    parser.add_argument("--llama-build", type=Path, default=PEERS_DIR / "llama.cpp" / "build-server")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--slots", type=int, default=8, help="parallel slots (our --batch-size, llama's -np)")
    parser.add_argument("--context-per-slot", type=int, default=512, help="llama-server's -c is slots x this")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=18571)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    # SIGTERM as Ctrl-C: the server of the turn is stopped on the way out (run_system's finally)
    signal.signal(signal.SIGTERM, interrupted)
    commands = server_commands(args, args.port)
    rounds = []
    for k in range(args.rounds):
        order = list(commands) if k % 2 == 0 else list(reversed(commands))
        rows = [row for name in order for row in run_system(name, commands[name], args.port, args)]
        rounds.append(rows)
        for row in rows:
            print(f"round {k + 1}  {row['system']:<13} C={row['clients']:<2} {row['tokens_per_s']:7.1f} tok/s  "
                  f"TTFT {row['ttft_ms']:7.1f} ms  ({row['requests']} requests, {row['wall_s']:.1f} s)", flush=True)
    summary = ratios(rounds, args.clients)
    for c, r in summary.items():
        print(f"C={c}: trtllm-serve / llama-server: throughput {r['tokens_per_s'][0]:.2f}x "
              f"[{r['tokens_per_s'][1]:.2f}-{r['tokens_per_s'][2]:.2f}], TTFT {r['ttft'][0]:.2f}x "
              f"[{r['ttft'][1]:.2f}-{r['ttft'][2]:.2f}]")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds,
                                        "ratios": summary}, indent=1))


if __name__ == "__main__":
    main()
