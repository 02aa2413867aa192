"""An LLM judge for cascades: a route's `judge` deployment grades each verified answer
with a fixed rubric, and when it answers, its grade replaces the learned verifier's
score for the threshold decision. On a timeout, an error or a reply with no grade, the
verifier's score stands (the learned verifier is the default and the fallback); a judge
its circuit breaker ejected is not called at all until its cooldown ends.

The rubric (`RUBRIC`, versioned as `RUBRIC_VERSION`) asks for one digit, 1 to 9: a
digit is one token in every tokenizer (Llama's split "10" into "1" and "0"), so the
grade fits in `max_tokens: 1`. The score is the expected grade, (E[g] - 1) / 8 in
[0, 1]: from the first token's logprobs where the deployment returns them (`logprobs:
true, top_logprobs: 10`, the probability mass over the digits, renormalised), else
from the reply's text (its first number).

Each call is priced as one of the request's calls, `<request id>:j<n>` (n: the n-th
answer judged): for its answer; cut off by its timeout or the request's cancellation,
for its prompt (status `partial`, as a second opinion); a failed one is not. The wait
is at most the route's `judge_timeout_ms` and half the time left before the request's
deadline (an escalation needs the rest).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.billing.tokens import PromptCounts
from gateway.errors import GatewayError, UpstreamTimeout
from gateway.ledger import SpendRecord
from gateway.metrics import Metrics
from gateway.pipeline.accounting import Accountant, counted_usage, reply_usage
from gateway.pipeline.executor import Completed, Executor
from gateway.pipeline.scoring import answer_parts, prompt_text
from gateway.request import Call
from gateway.runtime import DeploymentRuntime
from gateway.upstreams.base import EndpointType

log = logging.getLogger(__name__)

OutcomeType = Literal["ok", "fallback_timeout", "fallback_error", "unparsed"]
SourceType = Literal["logprobs", "text"]

RUBRIC_VERSION = "cascade-judge/1"
RUBRIC = """\
You grade an AI assistant's answer to a user's request. Judge only the answer given:
is it correct, does it do everything the request asks (format, length, language,
constraints), is it complete, clear and free of refusals, hedging or made-up facts?

Reply with a single digit from 1 to 9 and nothing else:
9 = excellent: correct and complete; an expert would not improve it.
7 = good: correct, minor omissions or style issues.
5 = mixed: partly correct or incomplete.
3 = poor: mostly wrong, off-topic or ignores the instructions.
1 = useless: wrong, empty or a refusal."""
GRADES = range(1, 10)
TOP_LOGPROBS = 10
# The grades' share of the first token's probability below which the logprobs give no
# grade ("Excellent" with 3% on digits): the text is read instead, else the verifier's.
MIN_GRADE_MASS = 0.5
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the judge said of one answer: `score` None when the verifier decides."""

    outcome: OutcomeType
    score: float | None = None
    source: SourceType | None = None


def judge_request(
    deployment: DeploymentRuntime,
    endpoint: EndpointType,
    body: Mapping[str, Any],
    reply: Mapping[str, Any],
) -> dict[str, Any]:
    """The chat body asking `deployment` to grade `reply` to the request `body`;
    logprobs asked only where the deployment returns them (others may refuse the field)."""
    answer = answer_parts(reply)[0]
    request = f"Request:\n{prompt_text(endpoint, body)}\n\nAnswer:\n{answer}\n\nGrade (1-9):"
    judged: dict[str, Any] = {
        "messages": [{"role": "system", "content": RUBRIC}, {"role": "user", "content": request}],
        "max_tokens": 1,
        "temperature": 0,
    }
    if deployment.returns_logprobs:
        judged |= {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
    return judged


def grade(reply: Mapping[str, Any]) -> tuple[float, SourceType] | None:
    """The judge's score in [0, 1] and where it came from; None: no grade in it."""
    expected = _logprob_grade(reply)
    if expected is not None:
        return (expected - 1) / 8, "logprobs"
    match = _NUMBER.search(answer_parts(reply)[0])
    if match is None or int(match.group()) not in GRADES:
        return None
    return (int(match.group()) - 1) / 8, "text"


def _logprob_grade(reply: Mapping[str, Any]) -> float | None:
    """The expected grade over the first token's alternatives (the token chosen among
    them); None without logprobs or when the grades hold under `MIN_GRADE_MASS` of the
    probability (the judge wrote something else first)."""
    choices = reply.get("choices") or [{}]
    logprobs = choices[0].get("logprobs") if isinstance(choices[0], Mapping) else None
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], Mapping):
        return None
    first = content[0]
    mass: dict[int, float] = {}
    for option in [first, *(first.get("top_logprobs") or [])]:
        token = str(option.get("token", "")).strip() if isinstance(option, Mapping) else ""
        if token.isdigit() and int(token) in GRADES and int(token) not in mass:
            mass[int(token)] = math.exp(float(option["logprob"]))
    total = sum(mass.values())
    if total < MIN_GRADE_MASS:  # it answered with words: a stray digit is no grade
        return None
    return sum(g * p for g, p in mass.items()) / total


class Judge:
    """Grades cascade answers with a route's judge deployment.

    verdict = await judge.grade(call, reply, ends_at, n=1, records=records)
    score = verdict.score if verdict.score is not None else verifier_score
    """

    def __init__(self, executor: Executor, accountant: Accountant, metrics: Metrics) -> None:
        self._executor, self._accountant, self._metrics = executor, accountant, metrics
        self._warned: set[tuple[str, OutcomeType]] = set()  # (route, outcome) logged once

    async def grade(
        self,
        call: Call,
        reply: Mapping[str, Any],
        ends_at: float,
        n: int,
        records: list[SpendRecord],
    ) -> Verdict:
        """The judge's verdict on `reply` to `call`, its call priced into `records` as
        `:j<n>`."""
        deployment = call.route.judge
        assert deployment is not None  # only routes with a judge ask
        if deployment.unavailable_reason is not None:
            return self._fallback(call, "fallback_error", deployment.unavailable_reason)
        if self._executor.ejected(deployment.name):  # down: no call, the verifier decides
            why = f"'{deployment.name}' is ejected by its circuit breaker"
            return self._fallback(call, "fallback_error", why)
        request = judge_request(deployment, call.endpoint, call.body, reply)
        label = f"j{n}"
        wait_s = min(call.route.judge_timeout_s, max(0.001, (ends_at - time.monotonic()) / 2))
        once = dataclasses.replace(deployment, max_retries=0)  # a late grade is no use
        try:
            done = await self._executor.complete([once], "chat", request, wait_s)
        except UpstreamTimeout as error:
            records.append(self._price(call, deployment, request, None, label))
            return self._fallback(call, "fallback_timeout", str(error))
        except GatewayError as error:  # failed: nothing to pay
            return self._fallback(call, "fallback_error", str(error))
        except asyncio.CancelledError:  # the request ended: the upstream had the prompt
            records.append(self._price(call, deployment, request, None, label))
            raise
        records.append(self._price(call, deployment, request, done, label))
        graded = grade(done.reply.body)
        if graded is None:
            return self._fallback(
                call, "unparsed", f"no grade in {answer_parts(done.reply.body)[0]!r}"
            )
        self._count(call, "ok")
        return Verdict("ok", *graded)

    def _price(
        self,
        call: Call,
        deployment: DeploymentRuntime,
        request: dict[str, Any],
        done: Completed | None,
        label: str,
    ) -> SpendRecord:
        """Its answer's usage, else its prompt's (`partial`); the prompt is the judge's
        own, so counted apart from the request's (`call.prompt`)."""
        prompt = PromptCounts()
        if done is not None:
            usage = reply_usage(deployment, "chat", request, done.reply.body, prompt)
            return self._accountant.settle(call, deployment, usage, label=label)
        usage = counted_usage(deployment, "chat", request, (), prompt)
        return self._accountant.settle(call, deployment, usage, status="partial", label=label)

    def _fallback(self, call: Call, outcome: OutcomeType, why: str) -> Verdict:
        """The verifier decides; the first failure of each kind on a route is a warning,
        the rest are counted (a judge down for an hour would flood the log)."""
        self._count(call, outcome)
        key = (call.route.name, outcome)
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        log.log(level, "judge of route '%s' (%s): %s; the verifier decides", *key, why)
        return Verdict(outcome)

    def _count(self, call: Call, outcome: OutcomeType) -> None:
        m = self._metrics
        m.child(m.judge_calls, call.route.name, outcome).inc()
