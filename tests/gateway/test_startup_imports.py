"""What `serve` imports before it is ready: only what serving needs. Heavy modules that
only some policies, commands or training use are imported on first use, which these
tests pin (the time itself is `tests/benchmarks/startup.py`'s). Each check runs in a
fresh interpreter: this one has imported everything already.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Module -> who imports it, later.
DEFERRED = {
    "litellm": "the litellm client, on a deployment's first call (gateway.upstreams)",
    "torch": "the embedding classifier and the embedded CPU engine",
    "sentence_transformers": "the embedding classifier (classifier: minilm)",
    "transformers": "the embedding classifier (classifier: minilm)",
    "pyarrow": "the spend archive (CASCADE_LEDGER_ARCHIVE_DIR, spend export)",
    "duckdb": "spend report --archive",
    "numpy": "the router's models, for routes that score, verify or select (loaded by a "
    "thread once serving: gateway.pipeline.scoring.warm)",
    "aiohttp": "the upstream transport, imported by a thread it starts",
    "router.verifier": "cascades and verified select routes (warmed by the same thread)",
    "router.classifier": "routes that score (warmed by the same thread)",
}
# Router modules that train or evaluate: never needed to serve a request.
TRAINING = re.compile(r"router\.training(\.\w+)*")
SERVE = """
import json, sys
from pathlib import Path
import gateway.cli, gateway.http.app
from gateway.pipeline.scoring import install_problems
from policies import load_policy
from policies.providers import litellm_providers
load_policy(Path(sys.argv[1]), install_check=install_problems)  # as serve loads it
print(json.dumps({
    "modules": sorted(sys.modules),
    "litellm_sources_read": litellm_providers.cache_info().misses > 0,
}))
"""
EXAMPLE = "policies/examples/openai-compatible.yaml"
EXAMPLE_ENV = {"UPSTREAM_BASE_URL": "http://127.0.0.1:9/v1"}


def fresh_interpreter(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


@pytest.fixture(scope="module")
def serving() -> dict[str, object]:
    """What the serve path has imported once its policy is loaded (an OpenAI-compatible
    deployment, a fallback route: nothing that needs the router's models)."""
    env = {**os.environ, **EXAMPLE_ENV}
    loaded: dict[str, object] = json.loads(fresh_interpreter(SERVE, EXAMPLE, env=env))
    return loaded


@pytest.mark.parametrize("module", sorted(DEFERRED))
def test_serving_leaves_heavy_modules_to_first_use(module: str, serving: dict[str, object]) -> None:
    modules = serving["modules"]
    assert isinstance(modules, list)
    assert module not in modules, f"{module} is for {DEFERRED[module]}, not startup"


def test_serving_imports_no_training_code(serving: dict[str, object]) -> None:
    modules = serving["modules"]
    assert isinstance(modules, list)
    assert [name for name in modules if TRAINING.fullmatch(name)] == []


def test_an_openai_compatible_policy_reads_none_of_litellms_sources(
    serving: dict[str, object],
) -> None:
    """litellm's provider list (parsed from its source) is read for litellm providers."""
    assert serving["litellm_sources_read"] is False


@pytest.mark.parametrize("package", ["policies", "local_engine"])
def test_a_lower_part_loads_neither_router_nor_gateway(package: str) -> None:
    code = f"import json, sys, {package}; print(json.dumps(sorted(sys.modules)))"
    modules = json.loads(fresh_interpreter(code))
    assert [m for m in modules if m.split(".")[0] in ("router", "gateway")] == []


START = """
import asyncio, json
import tiktoken.registry
from gateway.http.app import start_services, stop_services
from gateway.settings import Settings

async def main():
    services = await start_services(Settings())
    await stop_services(services)

asyncio.run(main())
print(json.dumps(sorted(tiktoken.registry.ENCODINGS)))
"""


def test_start_up_builds_only_the_encodings_the_policy_counts_with(tmp_path: Path) -> None:
    """The example's one deployment (`fake-model`) counts with cl100k: o200k (gpt-4o and
    the o-series), ~0.2 s of CPU, is built when a policy brings such a model."""
    env = {
        **os.environ,
        **EXAMPLE_ENV,
        "CASCADE_POLICY": EXAMPLE,
        "CASCADE_SPOOL_PATH": str(tmp_path / "ledger.spool"),
        "CASCADE_CACHE_DIR": str(tmp_path / "cache"),  # cold: tiktoken builds each one
    }
    assert json.loads(fresh_interpreter(START, env=env)) == ["cl100k_base"]
    cached = sorted(path.name.split("-")[-1] for path in (tmp_path / "cache").iterdir())
    assert cached == ["cl100k_base.ranks"]  # kept for the next start, and only it
