"""Build the CPU engine from checkpoint directories and serve it with uvicorn.

    serve(ServeOptions(port=8001))   # the shipped tiny model pair, speculation on

By default the shipped pair (`local_engine/models/tiny-target` with `tiny-draft` as its
draft) is served as `local-tiny`, the model name the default policy's local tier asks for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from local_engine.cpu.app import EngineService, create_app
from local_engine.cpu.checkpoint import load_model
from local_engine.cpu.engine import Engine, EngineOptions
from local_engine.cpu.errors import CheckpointError
from local_engine.cpu.metrics import EngineMetrics
from local_engine.cpu.model import LlamaForCausalLM
from local_engine.cpu.runner import EngineRunner
from local_engine.cpu.tokenizer import TOKENIZER_FILE, Tokenizer

log = logging.getLogger("local_engine")

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
DEFAULT_MODEL = MODELS_DIR / "tiny-target"
DEFAULT_DRAFT = MODELS_DIR / "tiny-draft"
DEFAULT_NAME = "local-tiny"


@dataclass(frozen=True)
class ServeOptions:
    model: Path | None = None
    draft_model: Path | None = None
    speculation: bool = True
    num_speculative_tokens: int | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8001
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    threads: int | None = None
    log_level: str = "info"


def build_service(options: ServeOptions) -> EngineService:
    """Load the model(s) and tokenizer; the engine thread starts with the app."""
    model_dir = options.model or DEFAULT_MODEL
    draft_dir = options.draft_model or (DEFAULT_DRAFT if options.model is None else None)
    tokenizer = Tokenizer.load(model_dir / TOKENIZER_FILE)
    target = load_model(model_dir)
    draft = load_model(draft_dir) if draft_dir is not None and options.speculation else None
    _check_vocab(target, draft, tokenizer)
    defaults = EngineOptions()
    engine_options = EngineOptions(
        max_num_seqs=options.max_num_seqs or defaults.max_num_seqs,
        max_model_len=options.max_model_len or target.config.max_position_embeddings,
        num_speculative_tokens=(
            defaults.num_speculative_tokens
            if options.num_speculative_tokens is None
            else options.num_speculative_tokens
        ),
    )
    name = options.served_model_name or (DEFAULT_NAME if options.model is None else model_dir.name)
    metrics = EngineMetrics(name)
    engine = Engine(target, tokenizer, draft=draft, options=engine_options, metrics=metrics)
    return EngineService(EngineRunner(engine), tokenizer, metrics, name, str(model_dir))


def serve(options: ServeOptions) -> None:
    import uvicorn

    logging.basicConfig(
        level=options.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    if options.threads:
        torch.set_num_threads(options.threads)
    service = build_service(options)
    engine = service.runner.engine
    log.info(
        "serving %s from %s (draft: %s, K=%d) on %s:%d",
        service.model_name,
        service.model_root,
        "none" if engine.draft is None else "on",
        engine.options.num_speculative_tokens,
        options.host,
        options.port,
    )
    uvicorn.run(
        create_app(service), host=options.host, port=options.port, log_level=options.log_level
    )


def _check_vocab(
    target: LlamaForCausalLM, draft: LlamaForCausalLM | None, tokenizer: Tokenizer
) -> None:
    if target.config.vocab_size < tokenizer.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {tokenizer.vocab_size} tokens; the model's vocab_size is "
            f"{target.config.vocab_size}"
        )
    if draft is not None and draft.config.vocab_size != target.config.vocab_size:
        raise CheckpointError(
            f"the draft's vocab_size is {draft.config.vocab_size}, the target's "
            f"{target.config.vocab_size}; a draft must share the target's tokenizer"
        )
