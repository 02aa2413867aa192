"""The id of the request being served, on every log line emitted while serving it, so a
client's `x-request-id` finds the request's lines in the logs.

    bind_request_id(request_id)             # where a request is given its id
    handler.addFilter(RequestIdFilter())    # gateway.settings.configure_logging

The id lives in a context variable: set in the request's task, it is seen by whatever
that task runs and by the tasks it starts (hedged attempts, a stream's relay), and by no
other request's.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

OUTSIDE_REQUESTS = "-"  # the id of a line emitted outside any request (startup, reloads)

_current: ContextVar[str] = ContextVar("request_id", default=OUTSIDE_REQUESTS)


def bind_request_id(request_id: str) -> None:
    """Make `request_id` the id of the lines logged from here on in this context."""
    _current.set(request_id)


class RequestIdFilter(logging.Filter):
    """Gives each record a `request_id` (the one bound where it was emitted, or "-"),
    for formats that show `%(request_id)s`. On a handler, it sees every record the
    handler writes, a third-party logger's too; a record that has one keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _current.get()
        return True
