"""A stand-in for `vllm serve`, run as its own process, for supervisor tests.

    python -m tests.fakes.vllm_process --port 8100 --load-seconds 0.5 --crash-after-s 2

Like vLLM it keeps its port closed while the "model loads", then serves `/health`
(200, or 503 once the engine is broken), `/metrics` with vLLM 0.33's names,
`/v1/models` and a minimal `/v1/chat/completions` (Bearer `VLLM_API_KEY` when set).
Knobs for failures: `--crash-after-s` (exit with `--exit-code`), `POST /crash` (exit at
once), `POST /break` or `--unhealthy-after-s` (health 503, process alive),
`--ignore-sigterm` (only SIGKILL stops it), `--term-delay-s` (slow graceful shutdown),
`--spawn-child` (a grandchild, like vLLM's engine-core workers, that must die with it).
Generation counters grow at `--tokens-per-second` once ready, plus each completion's.
Only the standard library is imported, so it starts in well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = "Hello from the fake vLLM."


class Engine:
    """The state the endpoints report; counters are totals since ready."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ready_at = time.monotonic()
        self.broken = False
        self.lock = threading.Lock()
        self.completions = 0
        self.completion_tokens = 0
        self.prompt_tokens = 0

    def healthy(self) -> bool:
        after = self.args.unhealthy_after_s
        return not self.broken and (after is None or time.monotonic() - self.ready_at < after)

    def generated(self) -> float:
        background = self.args.tokens_per_second * (time.monotonic() - self.ready_at)
        return background + self.completion_tokens

    def metrics(self) -> str:
        name = self.args.served_model_name
        labels = f'engine="0",model_name="{name}"'
        tokens = self.generated()
        drafts = tokens / 4
        lines = [
            ("vllm:num_requests_running", "gauge", self.args.running),
            ("vllm:num_requests_waiting", "gauge", self.args.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", self.args.kv_cache_usage),
            ("vllm:prompt_tokens_total", "counter", float(self.prompt_tokens)),
            ("vllm:generation_tokens_total", "counter", tokens),
            ("vllm:spec_decode_num_drafts_total", "counter", drafts),
            ("vllm:spec_decode_num_draft_tokens_total", "counter", drafts * 3),
            ("vllm:spec_decode_num_accepted_tokens_total", "counter", drafts * 2),
        ]
        body: list[str] = []
        for metric, kind, value in lines:
            body += [f"# HELP {metric} fake", f"# TYPE {metric} {kind}"]
            body.append(f"{metric}{{{labels}}} {value}")
        count = max(self.completions, 1)
        for metric, mean in (
            ("vllm:time_to_first_token_seconds", 0.05),
            ("vllm:inter_token_latency_seconds", 0.01),
        ):
            body += [f"# HELP {metric} fake", f"# TYPE {metric} histogram"]
            body.append(f'{metric}_bucket{{{labels},le="+Inf"}} {count}.0')
            body.append(f"{metric}_count{{{labels}}} {count}.0")
            body.append(f"{metric}_sum{{{labels}}} {mean * count}")
        return "\n".join(body) + "\n"

    def complete(self, request: dict[str, object]) -> dict[str, object]:
        messages = request.get("messages")
        prompt = json.dumps(messages) if isinstance(messages, list) else ""
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(REPLY.split())}
        with self.lock:
            self.completions += 1
            self.prompt_tokens += usage["prompt_tokens"]
            self.completion_tokens += usage["completion_tokens"]
        return {
            "id": f"chatcmpl-fake-{self.completions}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", self.args.served_model_name),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": REPLY},
                    "finish_reason": "stop",
                }
            ],
            "usage": {**usage, "total_tokens": sum(usage.values())},
        }


class Handler(BaseHTTPRequestHandler):
    engine: Engine  # set on the subclass `serve` makes

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"fake-vllm: {format % args}\n")

    def do_GET(self) -> None:
        if self.path == "/health":
            healthy = self.engine.healthy()
            self.reply(200 if healthy else 503, b"" if healthy else b'{"error":"EngineDeadError"}')
        elif self.path == "/metrics":
            self.reply(200, self.engine.metrics().encode(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models" and self.authorized():
            model = {"id": self.engine.args.served_model_name, "object": "model"}
            self.reply_json(200, {"object": "list", "data": [model]})
        elif self.path != "/v1/models":
            self.reply(404, b"")

    def do_POST(self) -> None:
        if self.path == "/crash":
            os._exit(self.engine.args.exit_code)
        if self.path == "/break":
            self.engine.broken = True
            self.reply(200, b"")
        elif self.path == "/v1/chat/completions" and self.authorized():
            length = int(self.headers.get("content-length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            self.reply_json(200, self.engine.complete(request))
        elif self.path != "/v1/chat/completions":
            self.reply(404, b"")

    def authorized(self) -> bool:
        key = os.environ.get("VLLM_API_KEY")
        if key and self.headers.get("authorization") != f"Bearer {key}":
            self.reply_json(401, {"error": "Unauthorized"})
            return False
        return True

    def reply_json(self, status: int, body: object) -> None:
        self.reply(status, json.dumps(body).encode(), "application/json")

    def reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.vllm_process")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", default="fake-model")
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--crash-after-s", type=float, default=None)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--unhealthy-after-s", type=float, default=None)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--term-delay-s", type=float, default=0.0)
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--tokens-per-second", type=float, default=0.0)
    parser.add_argument("--running", type=float, default=0.0)
    parser.add_argument("--waiting", type=float, default=0.0)
    parser.add_argument("--kv-cache-usage", type=float, default=0.0)
    return parser.parse_known_args(argv)[0]  # vLLM flags the fake has no use for pass


def handle_sigterm(args: argparse.Namespace, servers: list[ThreadingHTTPServer]) -> None:
    """SIGTERM stops the server after `--term-delay-s` (exits at once while loading)."""

    def on_term(signum: int, frame: object) -> None:
        if args.ignore_sigterm:
            return
        time.sleep(args.term_delay_s)
        if not servers:
            sys.exit(0)
        threading.Thread(target=servers[0].shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    servers: list[ThreadingHTTPServer] = []
    handle_sigterm(args, servers)
    sys.stderr.write(f"fake-vllm: pid {os.getpid()} loading for {args.load_seconds}s\n")
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        sys.stderr.write(f"fake-vllm: child pid {child.pid}\n")
    time.sleep(args.load_seconds)
    handler = type("BoundHandler", (Handler,), {"engine": Engine(args)})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    servers.append(server)
    if args.crash_after_s is not None:
        timer = threading.Timer(args.crash_after_s, os._exit, (args.exit_code,))
        timer.daemon = True
        timer.start()
    sys.stderr.write(f"fake-vllm: serving on {args.host}:{args.port}\n")
    server.serve_forever(poll_interval=0.05)
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
