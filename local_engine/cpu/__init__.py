"""Embedded CPU engine: Llama checkpoints served on CPU with torch, OpenAI/vLLM-compatible.

`cascade-gateway engine serve-cpu` runs it; modules here import torch, so import this
package only where the `[engine]` extra is installed.

    engine = Engine(load_model(path), Tokenizer.load(path / "tokenizer.json"))
"""

from __future__ import annotations

from local_engine.cpu.checkpoint import load_model, save_model
from local_engine.cpu.engine import Engine, EngineOptions
from local_engine.cpu.sampling import SamplingParams
from local_engine.cpu.tokenizer import Tokenizer

__all__ = ["Engine", "EngineOptions", "SamplingParams", "Tokenizer", "load_model", "save_model"]
