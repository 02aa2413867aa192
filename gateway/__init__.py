"""The HTTP gateway: OpenAI-compatible surface, request lifecycle, ledger, CLI.

`gateway.http.app.create_app` builds the ASGI app; it is not re-exported here so that
light users (the CLI's policy and spend commands) do not import the web stack.
"""

__all__: list[str] = []
