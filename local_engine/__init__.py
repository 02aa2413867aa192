"""Self-hosted engines (vLLM launch and supervision, embedded CPU engine): arrives
with the self-hosted tier issue."""

__all__: list[str] = []
