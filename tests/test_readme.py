"""The README's promises that a test can hold: the quick start installs torch's CPU
build (not the CUDA one the plain index serves), at the version the project pins, and
the README stays a front door."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def quick_start() -> str:
    """The first shell block after the quick start heading, continuations joined."""
    section = README.split("## Quick start", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return block.replace("\\\n", " ")


def test_the_quick_start_installs_torch_from_the_cpu_index_first() -> None:
    command = quick_start()
    steps = [step.strip() for step in command.split("&&")]
    torch_step = next(i for i, s in enumerate(steps) if s.startswith("pip install --no-deps torch"))
    engine_step = next(i for i, s in enumerate(steps) if "'.[engine]'" in s)
    assert torch_step < engine_step  # the extra then finds torch installed
    assert CPU_INDEX in steps[torch_step]


def test_the_quick_start_pins_the_torch_the_engine_extra_pins() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pinned = {re.sub(r"\s", "", r) for r in extras["engine"] if r.startswith("torch")}
    asked = re.search(r"torch==[\w.]+", quick_start())
    assert asked is not None and pinned == {asked.group(0)}


def test_the_readme_fits_on_two_pages() -> None:
    assert len(README.splitlines()) <= 250
