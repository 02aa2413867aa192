"""Prices and token counts: what a token costs per class (cache reads and writes,
reasoning, audio, image), how usage is read from a reply, and how prompts are counted
when an upstream reports nothing."""
