"""The policy ops edit: deployments, routes, teams, keys and budgets, in YAML.

Usage:

    loaded = load_policy(DEFAULT_POLICY_PATH)
"""

from __future__ import annotations

from pathlib import Path

from policies.errors import PolicyError
from policies.keys import hash_key
from policies.loader import InstallCheck, LoadedPolicy, load_policy
from policies.reloader import PolicyReloader
from policies.schema import Policy

DEFAULT_POLICY_PATH = Path(__file__).parent / "default.yaml"
EXAMPLES_DIR = Path(__file__).parent / "examples"

__all__ = [
    "DEFAULT_POLICY_PATH",
    "EXAMPLES_DIR",
    "InstallCheck",
    "LoadedPolicy",
    "Policy",
    "PolicyError",
    "PolicyReloader",
    "hash_key",
    "load_policy",
]
