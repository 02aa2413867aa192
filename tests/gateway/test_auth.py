"""Keys: hashed lookups, admin keys, and anonymous access from this machine only."""

from __future__ import annotations

import pytest

from gateway.auth import KeyTable, Principal
from gateway.errors import AuthenticationFailed
from policies import hash_key

CLIENT = Principal("app", "research", frozenset({"auto"}))
ANONYMOUS = Principal("anonymous", "default", None)
TABLE = KeyTable(
    principals={hash_key("fake-app-key"): CLIENT},
    admin_hashes=frozenset({hash_key("fake-admin-key")}),
    anonymous=ANONYMOUS,
)


def test_bearer_key_maps_to_its_principal() -> None:
    assert TABLE.authenticate("Bearer fake-app-key", "10.1.2.3") is CLIENT
    assert TABLE.authenticate("bearer  fake-app-key ", "10.1.2.3") is CLIENT
    with pytest.raises(AuthenticationFailed):
        TABLE.authenticate("Bearer fake-admin-key", "127.0.0.1")  # admin keys are not client keys


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "127.8.9.10"])
def test_anonymous_is_served_from_loopback(host: str) -> None:
    assert TABLE.authenticate(None, host) is ANONYMOUS


@pytest.mark.parametrize("host", ["10.0.0.5", "192.168.1.2", "2001:db8::1", None, "testclient"])
def test_anonymous_is_refused_from_elsewhere(host: str | None) -> None:
    with pytest.raises(AuthenticationFailed) as refused:
        TABLE.authenticate(None, host)
    assert refused.value.code == "missing_api_key"


def test_admin_key() -> None:
    TABLE.authenticate_admin("Bearer fake-admin-key")
    for header in (None, "Bearer fake-app-key", "Token fake-admin-key"):
        with pytest.raises(AuthenticationFailed):
            TABLE.authenticate_admin(header)


KEYLESS = KeyTable(principals={}, admin_hashes=frozenset(), anonymous=ANONYMOUS)


def test_without_client_keys_any_key_from_loopback_is_anonymous() -> None:
    """The OpenAI SDK cannot send no key: on a gateway with no client key at all
    (the embedded defaults), whatever it sends from this machine is served anonymously."""
    assert KEYLESS.authenticate("Bearer fake-any-key", "127.0.0.1") is ANONYMOUS
    with pytest.raises(AuthenticationFailed):
        KEYLESS.authenticate("Bearer fake-any-key", "10.0.0.5")


def test_with_client_keys_a_wrong_key_is_refused_even_from_loopback() -> None:
    """A mistyped key must not quietly become the anonymous team."""
    with pytest.raises(AuthenticationFailed) as refused:
        TABLE.authenticate("Bearer fake-mistyped-key", "127.0.0.1")
    assert refused.value.code == "invalid_api_key"
