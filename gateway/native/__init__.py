"""Bridged APIs served natively: a request to /v1/responses or /v1/messages that lands on
a deployment serving that wire format (its `responses` or `messages` capability) is
sent to it untranslated, and its answer relayed as it came.

The chat pipeline still runs the request (routing, limits, budgets, SLA, cascade,
ledger) on its chat form, what the bridge would send (`gateway.http.bridges`); per attempt,
the executor sends the client's own body to a deployment that serves it natively
(`NativeCall.body_for`, through `gateway.native.upstream`). The pipeline reads
such a reply through its chat view (`formats.chat_view`: usage for the ledger, text
for the verifier); a native stream is relayed event by event
(`gateway.pipeline.native_streams.NativeTally`), and a cascade's buffered answer is
streamed as its API's events, replayed from the reply (`gateway.native.replay`).
"""

from gateway.native.call import NativeCall
from gateway.native.formats import NativeSurface

__all__ = ["NativeCall", "NativeSurface"]
