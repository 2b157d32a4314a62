"""trtllm-serve's GET /metrics: Prometheus' text format (vLLM's and llama-server's endpoint), with
counters of requests, tokens and restored prompt tokens, gauges of the requests generating and
waiting, and histograms of the time to the first token and of a whole request."""
from __future__ import annotations

import bisect
import threading

# seconds (vLLM's buckets for the first token, and for whole requests)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
PREFIX = "trtllm"


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for le, n in zip(self.buckets, self.counts):
            total += n
            out.append(f'{name}_bucket{{le="{le}"}} {total}')
        return out + [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum}", f"{name}_count {self.count}"]


class Metrics:
    """What the HTTP threads record as they answer (under a lock: several record at once)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = {}  # (endpoint, HTTP status) -> answered requests
        self.prompt_tokens = self.generation_tokens = self.cached_tokens = 0
        self.ttft, self.latency = Histogram(TTFT_BUCKETS), Histogram(LATENCY_BUCKETS)

    def answered(self, endpoint: str, status: int, seconds: float | None = None, usage: dict | None = None,
                 ttft: float | None = None) -> None:
        with self.lock:
            key = (endpoint, status)
            self.requests[key] = self.requests.get(key, 0) + 1
            if usage is not None:
                self.prompt_tokens += usage["prompt_tokens"]
                self.generation_tokens += usage["completion_tokens"]
                self.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
            if seconds is not None:
                self.latency.observe(seconds)
            if ttft is not None:
                self.ttft.observe(ttft)

    def text(self, running: int, waiting: int, model: str) -> str:
        """The exposition: `running` requests have a KV slot, `waiting` ones wait for one."""
        escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")  # (the format's escapes)
        p, label = PREFIX, f'model_name="{escaped}"'
        with self.lock:
            lines = [f"# HELP {p}_requests_total Requests answered, by endpoint and HTTP status.",
                     f"# TYPE {p}_requests_total counter"]
            lines += [f'{p}_requests_total{{{label},endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]
            for name, value, what in (("prompt_tokens_total", self.prompt_tokens, "Prompt tokens of answered requests."),
                                      ("generation_tokens_total", self.generation_tokens, "Tokens generated."),
                                      ("cached_prompt_tokens_total", self.cached_tokens,
                                       "Prompt tokens whose KV was restored instead of computed.")):
                lines += [f"# HELP {p}_{name} {what}", f"# TYPE {p}_{name} counter", f"{p}_{name}{{{label}}} {value}"]
            for name, value, what in (("num_requests_running", running, "Requests generating (with a KV slot)."),
                                      ("num_requests_waiting", waiting, "Requests waiting for a KV slot.")):
                lines += [f"# HELP {p}_{name} {what}", f"# TYPE {p}_{name} gauge", f"{p}_{name}{{{label}}} {value}"]
            for name, hist, what in (("time_to_first_token_seconds", self.ttft, "Time to the first text (streams)."),
                                     ("e2e_request_latency_seconds", self.latency, "Time to the whole answer.")):
                lines += [f"# HELP {p}_{name} {what}", f"# TYPE {p}_{name} histogram"]
                lines += [line.replace("{", f"{{{label},", 1) if "{" in line else line.replace(" ", f"{{{label}}} ", 1)
                          for line in hist.lines(f"{p}_{name}")]
        return "\n".join(lines) + "\n"
