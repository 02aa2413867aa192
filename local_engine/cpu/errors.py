"""Embedded CPU engine exceptions.

EngineError (local_engine.errors)
└── CpuEngineError      base of everything the CPU engine raises
    ├── CheckpointError     a model directory lacks files or holds an unsupported model
    ├── InvalidRequest      a request the engine cannot run; names the bad field (`param`)
    └── ModelNotFound       a request for a model name this server does not serve
"""

from __future__ import annotations

from local_engine.errors import EngineError


class CpuEngineError(EngineError):
    pass


class CheckpointError(CpuEngineError):
    pass


class InvalidRequest(CpuEngineError):
    """A bad request field; `param` is the field's name as the client sent it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(CpuEngineError):
    pass
