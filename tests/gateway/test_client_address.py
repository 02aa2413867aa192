"""Who is local: a key-less request is the anonymous team's only when its socket peer is
loopback and no proxy forwarded it; a trusted proxy's X-Forwarded-For gives the client's
address, and still never makes a request local."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.datastructures import Headers

from gateway.auth import Origin, forwarded_for
from gateway.cli import _run_uvicorn, main
from gateway.settings import Settings
from tests.gateway.ledger_fixtures import free_port
from tests.support import serving

CLIENT_KEY = "fake-address-client-key"
POLICY = """
deployments:
  upstream:
    api_base: http://127.0.0.1:9/v1
    model: m
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  auto: {deployments: [upstream]}
auth: {anonymous_team: default}
"""
KEYS = """
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
TRUSTED = """
gateway:
  trusted_proxies: [127.0.0.0/8, 10.0.0.0/8]
"""
# What a client on this machine, or a proxy on it, can send to pass for local.
FORWARDED = [
    {"x-forwarded-for": "127.0.0.1"},
    {"forwarded": "for=127.0.0.1"},
    {"x-real-ip": "127.0.0.1"},
    {"X-Forwarded-For": "10.1.2.3, 127.0.0.1"},
]


def serve(tmp_path: Path, policy: str) -> Iterator[str]:
    """`cascade-gateway serve` as ops run it (uvicorn configured by the CLI, not by a
    test harness), on a loopback port: its base URL."""
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "REDIS"))}
    env |= {"GATEWAY_TEST_KEY": CLIENT_KEY, "CASCADE_SPOOL_PATH": str(tmp_path / "spool")}
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(path)]
    proc = subprocess.Popen(
        [*argv, "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        serving(proc, lambda: healthy(base), 60, lambda: proc.stdout.read() if proc.stdout else "")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if proc.stdout:
            proc.stdout.close()


def healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve(tmp_path_factory.mktemp("keyed"), POLICY + KEYS + TRUSTED)


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve(tmp_path_factory.mktemp("keyless"), POLICY)


def models(base: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{base}/v1/models", headers=headers)


def test_a_direct_keyless_request_from_loopback_is_anonymous(keyed: str) -> None:
    assert models(keyed).status_code == 200


@pytest.mark.parametrize("forwarding", FORWARDED)
def test_a_forwarded_request_is_never_local(keyed: str, forwarding: dict[str, str]) -> None:
    """Not with a loopback peer, not from a trusted proxy (this policy trusts
    127.0.0.0/8): a proxy on this machine relays whoever reached it."""
    refused = models(keyed, **forwarding)
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["code"] == "missing_api_key"
    # A client key is served through a proxy as directly.
    assert models(keyed, authorization=f"Bearer {CLIENT_KEY}", **forwarding).status_code == 200


@pytest.mark.parametrize("forwarding", FORWARDED)
def test_without_client_keys_any_key_counts_as_none_only_when_local(
    keyless: str, forwarding: dict[str, str]
) -> None:
    """The embedded defaults' promise (the OpenAI SDK always sends a key) holds for a
    direct request from this machine, not for a forwarded one."""
    assert models(keyless, authorization="Bearer fake-any-key").status_code == 200
    forwarded = models(keyless, authorization="Bearer fake-any-key", **forwarding)
    assert forwarded.status_code == 401
    assert models(keyless, **forwarding).status_code == 401


def test_serve_turns_uvicorns_proxy_headers_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Else uvicorn would replace the socket peer with X-Forwarded-For's address for
    any peer in FORWARDED_ALLOW_IPS (127.0.0.1 by default) before the app sees it."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: seen.update(options))
    _run_uvicorn(Settings())
    assert seen["proxy_headers"] is False


def networks(*cidrs: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(cidr) for cidr in cidrs]


TRUSTED_NETWORKS = networks("10.0.0.0/8", "fd00::/8")


@pytest.mark.parametrize(
    ("chain", "address"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("203.0.113.7, 10.0.0.2", "203.0.113.7"),
        # The client wrote the left part: the right-most untrusted entry is its address.
        ("127.0.0.1, 198.51.100.1, 203.0.113.7, 10.0.0.2", "203.0.113.7"),
        ("10.0.0.3,10.0.0.2", "10.0.0.3"),  # every hop trusted: the first
        ("2001:db8::1, fd00::2", "2001:db8::1"),
        ("not-an-address, 10.0.0.2", "10.0.0.2"),  # stops at the last good entry
        ("", None),
    ],
)
def test_forwarded_for_takes_the_rightmost_untrusted_address(chain: str, address: str) -> None:
    assert forwarded_for(chain, TRUSTED_NETWORKS) == address


def test_origin_believes_forwarding_headers_from_trusted_proxies_only() -> None:
    headers = Headers(raw=[(b"x-forwarded-for", b"198.51.100.1, 203.0.113.7")])
    trusted = Origin.of("10.0.0.2", headers, TRUSTED_NETWORKS)
    assert (trusted.address, trusted.forwarded, trusted.direct_peer) == ("203.0.113.7", True, None)
    untrusted = Origin.of("192.0.2.9", headers, TRUSTED_NETWORKS)
    assert untrusted.address == "192.0.2.9"
    # Repeated headers form one chain, in order.
    split = Headers(raw=[(b"x-forwarded-for", b"203.0.113.7"), (b"x-forwarded-for", b"10.0.0.5")])
    assert Origin.of("10.0.0.2", split, TRUSTED_NETWORKS).address == "203.0.113.7"
    direct = Origin.of("127.0.0.1", Headers(), TRUSTED_NETWORKS)
    assert (direct.address, direct.forwarded, direct.direct_peer) == (
        "127.0.0.1",
        False,
        "127.0.0.1",
    )
    # A proxy that says only `Forwarded` or `X-Real-IP` forwarded it; its peer is the address.
    real_ip = Origin.of("10.0.0.2", Headers({"x-real-ip": "203.0.113.7"}), TRUSTED_NETWORKS)
    assert (real_ip.address, real_ip.direct_peer) == ("10.0.0.2", None)


def test_policy_check_notes_the_anonymous_team(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    assert main(["policy", "check", str(path)]) == 0
    assert (
        "note: auth.anonymous_team 'default' serves key-less requests from loopback "
        "without forwarding headers"
    ) in capsys.readouterr().out
    path.write_text(POLICY.replace("auth: {anonymous_team: default}", ""))
    assert main(["policy", "check", str(path)]) == 0
    assert "anonymous_team" not in capsys.readouterr().out


def test_trusted_proxies_are_networks_named_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY + "gateway:\n  trusted_proxies: [10.0.0.0/8, 10.0.0.1/8, proxy.lan]\n")
    assert main(["policy", "check", str(path)]) == 1
    errors = capsys.readouterr().err
    assert "gateway.trusted_proxies.1: '10.0.0.1/8' has host bits set" in errors
    assert "the network is 10.0.0.0/8" in errors
    assert "gateway.trusted_proxies.2: 'proxy.lan' does not appear" in errors
    assert "gateway.trusted_proxies.0" not in errors
