"""What a `select` route's traffic says of its deployments:
`cascade-gateway spend quality --route ROUTE`.

Per deployment, from the route's recent ledger records (each carries the quality the
predictor expected of its deployment, `predicted_quality`, and the verifier's score
where its answer was verified): how many answers it gave and what they cost, the mean
predicted quality, how many were verified and the share the verifier accepted (score
at or above the route's `verify_threshold`), the gap between the two (what the
predictor misses on this traffic), and the offset the fleet has learned for it so far
(`pipeline/shared_profiles`, from Redis). A gap far from the learned offset means the
learning has not caught up yet, or `quality_profile` names the wrong model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.ledger import SpendRecord
from gateway.ledger.record import UNANSWERED
from gateway.pipeline.shared_profiles import profile_key
from gateway.spend.report import csv_text

COLUMNS = [
    "deployment",
    "answers",
    "cost_usd",
    "predicted_quality",
    "verified",
    "accepted_share",
    "gap",
    "learned_offset",
    "learned_from",
]


class NoSelectAnswers(Exception):
    """The records read hold no answer of a select choice on the route."""


@dataclass
class DeploymentQuality:
    deployment: str
    answers: int = 0
    cost_nanos: int = 0
    predicted_sum: float = 0.0
    verified: int = 0
    accepted: int = 0

    def row(self, learned: tuple[float, int] | None) -> dict[str, Any]:
        predicted = self.predicted_sum / self.answers
        share = self.accepted / self.verified if self.verified else None
        return {
            "deployment": self.deployment,
            "answers": self.answers,
            "cost_usd_nanos": self.cost_nanos,
            "predicted_quality": round(predicted, 4),
            "verified": self.verified,
            "accepted_share": None if share is None else round(share, 4),
            "gap": None if share is None else round(share - predicted, 4),
            "learned_offset": None if learned is None else round(learned[0], 4),
            "learned_from": None if learned is None else learned[1],
        }


def tally(records: Iterable[SpendRecord], route: str, threshold: float) -> list[DeploymentQuality]:
    """The route's records that a `select` choice priced, by deployment (most answers
    first)."""
    found: dict[str, DeploymentQuality] = {}
    for record in records:
        if record.route != route or record.predicted_quality is None:
            continue
        if record.status in UNANSWERED:  # a request's error record: no answer to count
            continue
        entry = found.setdefault(record.deployment, DeploymentQuality(record.deployment))
        entry.answers += 1
        entry.cost_nanos += record.cost_nanos
        entry.predicted_sum += record.predicted_quality
        if record.verifier_score is not None:
            entry.verified += 1
            entry.accepted += record.verifier_score >= threshold
    return sorted(found.values(), key=lambda q: (-q.answers, q.deployment))


async def learned_offsets(client: Any, prefix: str, deployments: list[str]) -> dict[str, Any]:
    """Each deployment's shared (offset, observations), where the fleet learned any."""
    learned: dict[str, Any] = {}
    for deployment in deployments:
        offset, seen = await client.hmget(
            profile_key(prefix, deployment), ["offset", "observations"]
        )
        if offset is not None and seen is not None:
            learned[deployment] = (float(offset), int(seen))
    return learned


def render(
    tallies: list[DeploymentQuality], learned: Mapping[str, tuple[float, int]], fmt: str
) -> str:
    rows = [q.row(learned.get(q.deployment)) for q in tallies]
    if fmt == "json":
        for row in rows:
            row["cost_usd"] = row.pop("cost_usd_nanos") / 1e9
        return json.dumps(rows, indent=2) + "\n"
    return csv_text(rows, COLUMNS, {"cost_usd": "cost_usd_nanos"})
