"""Token classes without a gateway: reading them from upstream usage, pricing them as
providers bill them, and carrying them through the ledger and the spend report."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import date
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.billing.pricing import (
    NO_RATES,
    ClassRates,
    TokenPrice,
    litellm_class_rates,
    lookup_litellm,
    policy_price,
)
from gateway.billing.usage import CLASS_NAMES, NO_CLASSES, TokenClasses, token_classes
from gateway.ledger import LedgerStore, SpendRecord
from gateway.ledger.record import SPARSE_FIELDS
from gateway.pipeline.accounting import reported_usage
from gateway.spend.report import COLUMNS, csv_text, report_row, total
from policies.schema import Price
from tests.gateway.ledger_fixtures import CONTRACT_DB, DAY0, make_record, store_factory

# What litellm 1.x hands the gateway for an Anthropic answer with 3 uncached input tokens,
# 1000 read from the cache and 200 written to it: Anthropic's `input_tokens` leaves cache
# tokens out, litellm's `prompt_tokens` has them in (and says so twice).
LITELLM_ANTHROPIC_USAGE = {
    "completion_tokens": 9,
    "prompt_tokens": 1203,
    "total_tokens": 1212,
    "completion_tokens_details": {"reasoning_tokens": 0, "text_tokens": 9},
    "prompt_tokens_details": {
        "cache_write_tokens": 200,
        "cached_tokens": 1000,
        "text_tokens": 3,
        "cache_creation_tokens": 200,
    },
    "cache_creation_input_tokens": 200,
    "cache_read_input_tokens": 1000,
}
OPENAI_USAGE = {
    "prompt_tokens": 2000,
    "completion_tokens": 300,
    "prompt_tokens_details": {"cached_tokens": 1536, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 200, "audio_tokens": 0},
}


def test_openai_cached_and_reasoning_tokens_are_parts_of_the_totals() -> None:
    usage = reported_usage({"usage": OPENAI_USAGE})
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (2000, 300)  # not 3536 / 500
    assert usage.classes == TokenClasses(cache_read=1536, reasoning=200)


def test_anthropic_cache_reads_and_writes_as_litellm_translates_them() -> None:
    usage = reported_usage({"usage": LITELLM_ANTHROPIC_USAGE})
    assert usage is not None and usage.prompt_tokens == 1203
    assert usage.classes == TokenClasses(cache_read=1000, cache_write=200)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # litellm's top-level fields alone, and DeepSeek's cache hits
        ({"prompt_tokens": 50, "cache_read_input_tokens": 40}, TokenClasses(cache_read=40)),
        ({"prompt_tokens": 50, "prompt_cache_hit_tokens": 30}, TokenClasses(cache_read=30)),
        # cached audio is counted once, as a cache read
        (
            {
                "prompt_tokens": 100,
                "prompt_tokens_details": {
                    "cached_tokens": 64,
                    "audio_tokens": 80,
                    "cached_tokens_details": {"audio_tokens": 60},
                },
            },
            TokenClasses(cache_read=64, audio_prompt=20),
        ),
        # classes never exceed their total: cache reads first, then the rest
        (
            {
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 8, "audio_tokens": 8},
                "completion_tokens_details": {"reasoning_tokens": 9, "image_tokens": 3},
            },
            TokenClasses(cache_read=8, audio_prompt=2, reasoning=5),
        ),
        (
            {
                "prompt_tokens": 7,
                "prompt_tokens_details": {"image_tokens": 5},
                "completion_tokens": 4,
                "completion_tokens_details": {"audio_tokens": 1, "image_tokens": 2},
            },
            TokenClasses(image_prompt=5, audio_completion=1, image_completion=2),
        ),
        ({"prompt_tokens": 5, "prompt_tokens_details": None}, NO_CLASSES),
        ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": "5"}}, NO_CLASSES),
        ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": -5}}, NO_CLASSES),
        ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": True}}, NO_CLASSES),
        ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2.0}}, TokenClasses(2)),
    ],
)
def test_token_classes_read_and_clamped(usage: dict[str, Any], expected: TokenClasses) -> None:
    assert token_classes(usage) == expected


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -3, "completion_tokens": 2},
        {"prompt_tokens": 3, "completion_tokens": None},
        {"prompt_tokens": "3"},
        {"prompt_tokens": True},
        {"prompt_tokens": 2.5},
        {"completion_tokens": 4},
    ],
)
def test_malformed_totals_are_not_reported_usage(usage: dict[str, Any]) -> None:
    """The tokenizer counts these instead (`usage_source: counted`)."""
    assert reported_usage({"usage": usage}) is None


KEYS = st.sampled_from(
    [
        "prompt_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
        "cached_tokens",
        "cache_creation_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "prompt_cache_hit_tokens",
        "cached_tokens_details",
        "audio_tokens",
        "image_tokens",
        "reasoning_tokens",
    ]
) | st.text(max_size=8)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=6),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(usage=JSON)
def test_any_usage_never_raises_and_never_counts_negative_or_twice(usage: Any) -> None:
    found = reported_usage({"usage": usage})
    if found is None:
        return
    assert found.prompt_tokens >= 0 and found.completion_tokens >= 0
    counts = [getattr(found.classes, name) for name in CLASS_NAMES]
    assert all(isinstance(n, int) and n >= 0 for n in counts)
    assert found.classes.prompt <= found.prompt_tokens
    assert found.classes.completion <= found.completion_tokens
    price = lookup_litellm("claude-sonnet-4-5")
    args = (found.prompt_tokens, found.completion_tokens, found.classes)
    assert price.cost_nanos(*args) >= 0


def test_a_cached_prompt_is_priced_as_anthropic_bills_it() -> None:
    """litellm's map for claude-sonnet-4-5, in nano-dollars per token: input 3000, cache
    read 300 (a tenth), cache write 3750 (1.25x), output 15000."""
    price = lookup_litellm("claude-sonnet-4-5")
    classes = TokenClasses(cache_read=1000, cache_write=200)
    assert price.cost_nanos(1203, 9, classes) == 3 * 3000 + 1000 * 300 + 200 * 3750 + 9 * 15000
    assert price.cost_nanos(1203, 9, classes) == 1_194_000  # what litellm's `cost` says
    uncached = 1203 * 3000 + 9 * 15000
    assert price.cache_savings_nanos(1203, 9, classes) == uncached - 1_194_000
    # writing without reading costs more than no cache at all
    write_only = TokenClasses(cache_write=1000)
    assert price.cache_savings_nanos(1000, 0, write_only) == 1000 * (3000 - 3750)


def test_openai_cached_input_and_reasoning_at_the_maps_rates() -> None:
    gpt4o = lookup_litellm("gpt-4o")  # input 2500, cached 1250, output 10000 nanos/token
    classes = TokenClasses(cache_read=1536, reasoning=200)
    assert gpt4o.cost_nanos(2000, 300, classes) == 464 * 2500 + 1536 * 1250 + 300 * 10000
    # a map with a reasoning rate of its own prices reasoning tokens at it
    qwen = lookup_litellm("dashscope/qwen-turbo")  # output 200, reasoning 500 nanos/token
    assert qwen.rate("reasoning") == 5e-07
    reasoning = TokenClasses(reasoning=60)
    assert qwen.cost_nanos(0, 100, reasoning) == 40 * 200 + 60 * 500


def test_without_classes_the_price_is_the_plain_formula() -> None:
    price = lookup_litellm("claude-sonnet-4-5")
    for prompt, completion in [(0, 0), (1, 1), (123_457, 8_191), (10**9, 3)]:
        plain = round((prompt * 3e-6 + completion * 15e-6) * 1e9)
        assert price.cost_nanos(prompt, completion) == plain
        assert price.cost_nanos(prompt, completion, NO_CLASSES) == plain
        assert price.cache_savings_nanos(prompt, completion, NO_CLASSES) == 0


def test_a_class_without_a_rate_is_priced_as_plain_input_or_output() -> None:
    price = TokenPrice(1e-6, 4e-6, "policy")
    classes = TokenClasses(cache_read=10, cache_write=10, audio_prompt=5, reasoning=7)
    assert price.cost_nanos(40, 20, classes) == 40 * 1000 + 20 * 4000
    assert price.cache_savings_nanos(40, 20, classes) == 0


def test_the_policys_price_overrides_and_falls_back_to_the_providers_rates() -> None:
    own = Price(
        input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5, reasoning_per_mtok=0
    )
    rates = policy_price(own, litellm_class_rates("gpt-4o")).rates
    assert (rates.cache_read, rates.reasoning) == (0.5e-6, 0.0)  # set: the policy's (0: free)
    assert rates.cache_write is None  # the map has none for gpt-4o: plain input
    anthropic = policy_price(
        Price(input_per_mtok=2.0, output_per_mtok=8.0),
        litellm_class_rates("claude-sonnet-4-5", "anthropic"),
    )
    assert (anthropic.rates.cache_read, anthropic.rates.cache_write) == (3e-7, 3.75e-6)
    unknown = policy_price(
        Price(input_per_mtok=2.0, output_per_mtok=8.0), litellm_class_rates("house-model")
    )
    assert unknown.rates == NO_RATES
    assert unknown.cost_nanos(100, 0, TokenClasses(cache_read=100)) == 100 * 2000


def test_zero_rates_in_the_map_are_no_rates() -> None:
    """deepseek-chat lists a cache write cost of 0: writes are billed as plain input."""
    rates = litellm_class_rates("deepseek/deepseek-chat")
    assert rates == ClassRates(cache_read=2.8e-08)


def test_records_carry_classes_and_old_records_read_zero() -> None:
    rec = make_record(3, cache_read_tokens=9, reasoning_tokens=4, cache_savings_nanos=-12)
    stored = orjson.loads(rec.to_json())
    assert stored["cache_read_tokens"] == 9 and "cache_write_tokens" not in stored  # sparse
    assert SpendRecord.from_dict(stored) == rec
    assert SpendRecord.from_dict({k: str(v) for k, v in rec.to_dict().items()}) == rec
    plain = make_record(4)
    stored_plain = orjson.loads(plain.to_json())
    assert set(stored_plain) == {f.name for f in dataclasses.fields(SpendRecord)} - SPARSE_FIELDS
    old = plain.to_dict()
    for name in ("cache_read_tokens", "reasoning_tokens", "cache_savings_nanos"):
        del old[name]
    assert SpendRecord.from_dict(old) == plain


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[LedgerStore]:
    async for make in store_factory(request.param, CONTRACT_DB):
        yield await make()


async def test_stores_sum_the_classes_and_cache_savings(store: LedgerStore) -> None:
    records = [
        make_record(1, cache_read_tokens=5, cache_write_tokens=2, cache_savings_nanos=700),
        make_record(2, reasoning_tokens=3, audio_prompt_tokens=1, image_completion_tokens=2),
        make_record(3, cache_write_tokens=4, cache_savings_nanos=-1_000),
        make_record(4),
    ]
    for rec in records:
        await store.record(rec)
    assert await store.get("req-1") == records[0]
    [row] = await store.aggregate(DAY0, DAY0, [])
    assert (row.cache_read_tokens, row.cache_write_tokens, row.reasoning_tokens) == (5, 6, 3)
    assert (row.audio_prompt_tokens, row.image_completion_tokens) == (1, 2)
    assert row.cache_savings_nanos == -300
    by_team = await store.aggregate(DAY0, DAY0, ["team"])
    assert sum(r.cache_savings_nanos for r in by_team) == -300


async def test_the_spend_report_has_a_column_per_class_and_exact_cache_savings(
    store: LedgerStore,
) -> None:
    await store.record(make_record(1, cache_read_tokens=1536, cache_savings_nanos=1_920_001))
    await store.record(make_record(2, reasoning_tokens=7))
    rows = await store.aggregate(DAY0, date(2026, 12, 31), ["team"])
    data = [report_row(row) for row in rows]
    assert COLUMNS[-8:] == (
        "cache_read_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
        "audio_prompt_tokens",
        "audio_completion_tokens",
        "image_prompt_tokens",
        "image_completion_tokens",
        "cache_savings_usd",
    )
    summed = report_row(total(rows))
    assert (summed["cache_read_tokens"], summed["reasoning_tokens"]) == (1536, 7)
    assert summed["cache_savings_nanos"] == 1_920_001
    assert summed["cache_savings_usd"] == 0.001920001
    header, *lines = csv_text(data, ["team", *COLUMNS]).splitlines()
    sales_line = next(line for line in lines if line.startswith("sales"))
    sales = dict(zip(header.split(","), sales_line.split(","), strict=True))
    assert (sales["cache_read_tokens"], sales["cache_savings_usd"]) == ("1536", "0.001920001")
