"""`cascade-gateway engine ...`: self-hosted engines from the command line.

`gateway/cli.py` calls `add_engine_commands(subparsers)`; each leaf parser sets
`func(args) -> int`. torch is imported inside the commands that need it, so the gateway's
CLI stays light. For a quick run: `python -m local_engine.cli serve-cpu --port 8001`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from local_engine.commands import add_vllm_commands

DEFAULT_CPU_PORT = 8001


def add_engine_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the `engine` command group on the main parser's subparsers."""
    engine = subparsers.add_parser("engine", help="self-hosted engines")
    commands = engine.add_subparsers(dest="engine_command", required=True)
    add_vllm_commands(commands)  # up, status, down: the policy's vLLM engines

    serve_cpu = commands.add_parser(
        "serve-cpu", help="serve a Llama checkpoint on CPU with an OpenAI/vLLM-compatible API"
    )
    serve_cpu.add_argument(
        "--model", type=Path, default=None, help="checkpoint directory (default: shipped model)"
    )
    serve_cpu.add_argument(
        "--draft-model",
        type=Path,
        default=None,
        help="draft checkpoint for speculative decoding (default: the shipped draft with the "
        "shipped model, none otherwise)",
    )
    serve_cpu.add_argument(
        "--no-speculation", action="store_true", help="decode without the draft model"
    )
    serve_cpu.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K")
    serve_cpu.add_argument("--served-model-name", default=None)
    serve_cpu.add_argument("--host", default="127.0.0.1")
    serve_cpu.add_argument("--port", type=tcp_port, default=DEFAULT_CPU_PORT)
    serve_cpu.add_argument("--max-num-seqs", type=int, default=None, help="running batch size")
    serve_cpu.add_argument("--max-model-len", type=int, default=None, help="tokens per sequence")
    serve_cpu.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    serve_cpu.add_argument("--log-level", default="info")
    serve_cpu.set_defaults(func=run_serve_cpu)


def tcp_port(text: str) -> int:
    """A port to bind, 1-65535: the OS would take 99999 as 99999 mod 65536, silently."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {port}")
    return port


def run_serve_cpu(args: argparse.Namespace) -> int:
    from local_engine.cpu.errors import CpuEngineError
    from local_engine.cpu.server import ServeOptions, serve

    options = ServeOptions(
        model=args.model,
        draft_model=args.draft_model,
        speculation=not args.no_speculation,
        num_speculative_tokens=args.num_speculative_tokens,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        threads=args.threads,
        log_level=args.log_level,
    )
    try:
        serve(options)
    except CpuEngineError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m local_engine.cli")
    add_engine_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["engine", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
