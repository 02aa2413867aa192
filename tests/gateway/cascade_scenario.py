"""A two-tier cascade route (`careful`: a cheap deployment, then a premium one, judged
by the shipped verifier), an arithmetic question, and a good answer and a refusal to
script the tiers with. Used by test_cascade_e2e, test_code_runs_e2e,
test_open_cascade_e2e, test_native_surfaces, test_native_passthrough,
test_responses_api and test_traffic_calibration."""

from __future__ import annotations

POLICY = """
deployments:
  cheap:
    api_base: ${CHEAP_URL}
    model: small-model
    tier: local-small
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
  premium:
    api_base: ${PREMIUM_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 5, output_per_mtok: 15}
routes:
  careful:
    strategy: cascade
    deployments: [cheap, premium]
    verify_threshold: 0.5
    max_escalations: 1
    reference_model: premium
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
QUESTION = {"role": "user", "content": "What is 17 * 23? Answer with the number."}
GOOD = "17 * 23 = 391. The answer is 391."
REFUSAL = "I am sorry, I cannot help with that."


def route_policy(threshold: float, *, run_code: bool) -> str:
    """POLICY with the route's threshold set, the cheap tier's logprobs off, and code
    examples run or not."""
    policy = POLICY.replace("verify_threshold: 0.5", f"verify_threshold: {threshold:.4f}")
    policy = policy.replace(
        "tier: local-small", "tier: local-small\n    cascade_logprobs: false", 1
    )
    if run_code:
        policy = policy.replace(
            "max_escalations: 1", "max_escalations: 1\n    run_code_examples: true"
        )
    return policy
