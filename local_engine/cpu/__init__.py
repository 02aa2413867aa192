"""Embedded CPU engine: Llama checkpoints served on CPU with torch, OpenAI/vLLM-compatible.

`cascade-gateway engine serve-cpu` runs it; modules here import torch, so import this
package only where the `[engine]` extra is installed.
"""

from __future__ import annotations

__all__: list[str] = []
