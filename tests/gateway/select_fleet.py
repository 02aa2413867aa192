"""Five deployments at different prices standing in for five models, cheapest first,
most with a quality profile, and `pick`, a `select` route over them that must meet 95%
of GPT-4's quality. Used by test_select_e2e and test_select_explain."""

from __future__ import annotations

# Cheapest first, whatever the answer's length: each is dearer in input and output.
PRICES = {
    "mistral": (0.2, 0.2),
    "mixtral": (0.6, 0.6),
    "yi": (0.8, 0.8),  # no quality_profile: the prior of its price
    "gpt35": (1.0, 2.0),
    "gpt4": (10.0, 30.0),
}
PROFILES = {
    "mistral": "mistralai/mistral-7b-chat",
    "mixtral": "mistralai/mixtral-8x7b-chat",
    "gpt35": "gpt-3.5-turbo-1106",
    "gpt4": "gpt-4-1106-preview",
}


def policy(route: str) -> str:
    """The five deployments (`${NAME_URL}` each, no retries) and `route` in YAML."""
    lines = ["deployments:"]
    for name, (inp, out) in PRICES.items():
        lines.append(f"  {name}:")
        lines.append(f"    api_base: ${{{name.upper()}_URL}}")
        lines.append(f"    model: {name}-model")
        lines.append("    max_retries: 0")
        lines.append(f"    price: {{input_per_mtok: {inp}, output_per_mtok: {out}}}")
        if name in PROFILES:
            lines.append(f"    quality_profile: {PROFILES[name]}")
    lines += ["routes:", route, "keys:", '  k: {secret: "${GATEWAY_TEST_KEY}"}', ""]
    return "\n".join(lines)


PICK = """  pick:
    strategy: select
    deployments: [gpt4, gpt35, yi, mixtral, mistral]
    reference_model: gpt4
    quality_target: 0.95"""
