"""Exceptions raised by `local_engine` (the vLLM side; the CPU engine has its own).

EngineError                 base of everything local_engine raises
├── EngineSpecError         an engine spec vLLM would reject, or one we cannot turn into argv
├── MetricsError            a /metrics body or scrape we cannot read
├── EngineStartError        an engine exited or stayed unready past its startup timeout
└── EngineStateError        the run directory's state files are missing, stale or unreadable
"""

from __future__ import annotations


class EngineError(Exception):
    pass


class EngineSpecError(EngineError):
    pass


class MetricsError(EngineError):
    pass


class EngineStartError(EngineError):
    pass


class EngineStateError(EngineError):
    pass
