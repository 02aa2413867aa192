"""Training, evaluation and calibration of the router's models: what builds the
artifacts under `router/models/` and judges them. Nothing here serves a request; the
serving modules in `router/` never import it (`router.cli` does, lazily, for its
training commands)."""
