"""A classifier route (`auto`: prompts scored below THRESHOLD to the cheap tier, the rest
to the premium one), its threshold left for each test to fill in. Used by
test_classifier_e2e and test_traffic_calibration."""

from __future__ import annotations

POLICY = """
deployments:
  cheap: {api_base: "${CHEAP_URL}", model: small, tier: local-small,
          price: {input_per_mtok: 0.1, output_per_mtok: 0.1}}
  premium: {api_base: "${PREMIUM_URL}", model: big, tier: premium,
            price: {input_per_mtok: 5, output_per_mtok: 15}}
routes:
  auto:
    strategy: classifier
    deployments: [cheap, premium]
    tiers: [{tier: local-small, below: THRESHOLD}, {tier: premium}]
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
