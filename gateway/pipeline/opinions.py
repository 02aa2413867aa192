"""Second opinions: a cascade's question asked of other deployments too, so the verifier
can compare final answers, or how alike their code is (`router.answers`): agreeing is
strong evidence for an answer, disagreeing against it.

A route's `second_opinions` are asked when its first tier is, concurrently, and only
once: every verified answer of the request is judged against the same opinions. The
first verification waits for them, at most half the time left before the request's
deadline (the escalation they may lead to needs the rest); an opinion not in by then
is cancelled and counts as absent, as does one that failed (logged, never an error
of the request). Every opinion is priced once, as `<request_id>:o<n>` (n its place
among those asked): for its answer, or, cut off in flight, for its prompt (status
`partial`, as a losing hedge); a failed one is not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from gateway.errors import GatewayError
from gateway.ledger import SpendRecord
from gateway.ledger.record import StatusType
from gateway.metrics import Metrics
from gateway.pipeline.accounting import (
    Accountant,
    count_unreported,
    counted_usage,
    reply_usage,
)
from gateway.pipeline.executor import Completed, Executor
from gateway.pipeline.scoring import answer_parts, question_text
from gateway.request import Call
from gateway.runtime import DeploymentRuntime, RouteRuntime
from gateway.upstreams.base import EndpointType

log = logging.getLogger(__name__)

OutcomeType = Literal["agree", "disagree", "no_answer", "failed"]


def configured(route: RouteRuntime) -> list[DeploymentRuntime]:
    """The route's second opinions that can be called: their settings (env vars) set."""
    return [d for d in route.second_opinions if d.unavailable_reason is None]


def worth_asking(endpoint: EndpointType, body: dict[str, Any]) -> bool:
    """Only questions whose answers can be compared (multiple choice and maths by their
    final answer, code by how alike it is) get second opinions: on any other prompt
    one is paid for and says nothing. The kind is the user's question's: a system
    prompt that mentions code fences does not make every question on its route code."""
    from router.answers import comparable  # routes with second opinions only

    return comparable(question_text(endpoint, body))


class SecondOpinions:
    """The second opinions of one request, from `ask` to `close` (which must run,
    however the request ends: it cancels what still runs and prices what answered).

        opinions = SecondOpinions(executor, accountant, metrics, call)
        opinions.ask(deployments)  # call.body, by call.deadline_s
        try:
            samples = await opinions.samples(reply, ends_at)
        finally:
            await opinions.close()
    """

    def __init__(
        self,
        executor: Executor,
        accountant: Accountant,
        metrics: Metrics,
        call: Call,
    ) -> None:
        self._executor, self._accountant, self._metrics = executor, accountant, metrics
        self._call = call
        self._asked: dict[asyncio.Task[Completed], tuple[str, DeploymentRuntime]] = {}
        self._samples: tuple[str, ...] | None = None
        self._priced: set[str] = set()  # labels of the opinions priced
        self._closed = False
        self.records: list[SpendRecord] = []
        self.agreeing = 0  # opinions that agree with the first verified answer (agrees)

    @property
    def answered(self) -> int:
        return len(self._samples or ())

    def ask(self, deployments: Sequence[DeploymentRuntime]) -> None:
        """Send the call's body to each of `deployments`, by the call's deadline."""
        call = self._call
        for n, deployment in enumerate(deployments, start=1):
            # One attempt, no retries: an opinion late from a backoff is no use, and a
            # task still running is then always a request the upstream has (see _price).
            once = dataclasses.replace(deployment, max_retries=0)
            task = asyncio.create_task(
                self._executor.complete([once], call.endpoint, call.body, call.deadline_s)
            )
            self._asked[task] = (f"o{n}", deployment)

    async def samples(self, reply: dict[str, Any], ends_at: float) -> tuple[str, ...]:
        """The answers of the opinions that answered, to verify `reply` with. The first
        call waits for them and counts whether each agrees with `reply`."""
        if self._samples is None:
            wait_s = max(0.0, (ends_at - time.monotonic()) / 2)
            _, late = await asyncio.wait(self._asked, timeout=wait_s)
            for task in late:
                task.cancel()  # absent; awaited in `close`
            self._samples = self._compare(answer_parts(reply)[0])
        return self._samples

    def _compare(self, answer: str) -> tuple[str, ...]:
        from router.answers import agrees

        question = question_text(self._call.endpoint, self._call.body)
        texts: list[str] = []
        for task, (_, deployment) in self._asked.items():
            outcome: OutcomeType = "failed"
            if _answered(task):
                text = answer_parts(task.result().reply.body)[0]
                texts.append(text)
                outcome = _outcome(agrees(question, answer, text))
                self.agreeing += outcome == "agree"
            m = self._metrics
            m.child(m.second_opinions, self._call.route.name, deployment.name, outcome).inc()
        return tuple(texts)

    async def close(self) -> None:
        """Cancel the opinions still running, wait for them, price those that answered.
        A cascade closes them as soon as no answer is left for them to judge, and again
        however it ends: a close cut short by a cancellation is finished then."""
        if self._closed:
            return
        call = self._call
        pending = [(deployment, reply) for _, deployment, reply in self._unpriced()]
        try:  # prompts to charge are counted first, off the loop when long
            await count_unreported(call.prompt, call.endpoint, call.body, pending)
        finally:
            # Priced however that wait ends (a cancelled request may not get past the next
            # await): one still running is charged its prompt, even if it answers later.
            self._price()
            for task in self._asked:
                task.cancel()
        await asyncio.gather(*self._asked, return_exceptions=True)
        self._closed = True
        for task, (_, deployment) in self._asked.items():
            if not task.cancelled() and (error := task.exception()) is not None:
                log.warning(
                    "second opinion %s of %s failed: %s",
                    deployment.name,
                    self._call.request_id,
                    error,
                    exc_info=not isinstance(error, GatewayError),  # a bug: its traceback
                )

    def _unpriced(self) -> Iterator[tuple[str, DeploymentRuntime, dict[str, Any] | None]]:
        """The opinions to price and not priced yet: with the reply of one that answered;
        None for one cut off in flight (running, or cancelled by us: with no retries, its
        one request was with the upstream, and a losing hedge is charged so too). A
        failed one is not priced."""
        for task, (label, deployment) in self._asked.items():
            if label in self._priced:
                continue
            if _answered(task):
                yield label, deployment, task.result().reply.body
            elif not task.done() or task.cancelled():
                yield label, deployment, None

    def _price(self) -> None:
        """Price each opinion once: its answer's usage if it answered, else its prompt."""
        call = self._call
        for label, deployment, reply in list(self._unpriced()):
            status: StatusType = "ok"
            if reply is not None:
                usage = reply_usage(deployment, call.endpoint, call.body, reply, call.prompt)
            else:
                usage = counted_usage(deployment, call.endpoint, call.body, (), call.prompt)
                status = "partial"
            self._priced.add(label)
            record = self._accountant.settle(call, deployment, usage, status=status, label=label)
            self.records.append(record)


def _outcome(agreed: bool | None) -> OutcomeType:
    if agreed is None:
        return "no_answer"
    return "agree" if agreed else "disagree"


def _answered(task: asyncio.Task[Completed]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None
