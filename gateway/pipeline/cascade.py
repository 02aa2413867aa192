"""Cascades: ask the cheapest tier, verify its answer, escalate while it is rejected.

Each tier is one `Executor.complete` over that tier's deployments (so a failing
deployment still falls back within its tier); a tier whose deployments all fail counts
as rejected. Every answer is priced in the ledger, the rejected ones too
(`<request_id>:<n>` for the n-th answer after the first), because every one was paid
for; only the one the client gets is judged against the route's SLA. If an escalation
fails outright, the last answer received is returned rather than an error: an
unverified answer beats none.

The verifier reads token logprobs, so on chat every tier but the last (whose answer is
not verified) is asked for them (`logprobs: true`) where its upstream returns them. A
client that did not ask for them gets its answer without them, as the upstream would
have sent it.

A bridged request (/v1/responses, /v1/messages) goes to each tier's deployments that
serve its wire format untranslated (`gateway.native`) and to the others as chat; the
verifier reads either answer through its chat view, and the bridge answers the client
in its own format whichever tier's answer it gets.

A route's `second_opinions` (see `gateway.pipeline.opinions`) are asked alongside the first tier
and handed to the verifier as samples; they are priced, and cancelled, however the
cascade ends, or as soon as only the last tier (not verified) is left.

A route's `judge` (see `gateway.pipeline.judge`) grades each verified answer after the verifier
has scored it; when it answers, its score replaces the verifier's for the threshold
decision (and in the answer's record and the decisions log), else the verifier's
stands. Its calls are priced like second opinions (`<request_id>:j<n>`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError
from gateway.ledger import SpendRecord
from gateway.metrics import Metrics
from gateway.pipeline.accounting import Accountant, Usage, count_unreported, reply_usage
from gateway.pipeline.code_runs import run_code
from gateway.pipeline.executor import Completed, Executor
from gateway.pipeline.judge import RUBRIC_VERSION, Judge
from gateway.pipeline.opinions import SecondOpinions, worth_asking
from gateway.pipeline.scoring import AnswerVerifier, unusable_answer
from gateway.request import Call
from gateway.runtime import DeploymentRuntime, tier_groups
from gateway.upstreams.base import UpstreamReply

if TYPE_CHECKING:
    from router.code_examples import ExampleRun

log = logging.getLogger(__name__)
decisions = logging.getLogger("gateway.decisions")  # the proxy's decisions log


@dataclass(frozen=True, slots=True)
class CascadeResult:
    final: Completed
    records: tuple[SpendRecord, ...]
    escalations: int
    scores: tuple[float, ...]  # the verifier's score of each answer it judged
    # (agreeing, answered) when second opinions were asked
    second_opinions: tuple[int, int] | None = None
    # The judge's score of each answer it graded (None: the verifier decided instead).
    judge_scores: tuple[float | None, ...] = ()
    # Upstream calls of every tier (the header's count), not only the last one's.
    attempts: int = 0
    # What the verifier made of the answer delivered (`x-cascade-verdict`): `accepted`,
    # `rejected` (its escalation failed) or `unjudged` (the last tier's).
    verdict: str = "unjudged"

    @property
    def cost_nanos(self) -> int:
        return sum(r.cost_nanos for r in self.records)


class Cascade:
    def __init__(
        self,
        executor: Executor,
        accountant: Accountant,
        verifier: AnswerVerifier,
        metrics: Metrics,
    ) -> None:
        self._executor = executor
        self._accountant = accountant
        self._verifier = verifier
        self._metrics = metrics
        self._judge = Judge(executor, accountant, metrics)

    async def run(
        self,
        call: Call,
        candidates: list[DeploymentRuntime],
        second_opinions: Sequence[DeploymentRuntime] = (),
        one_step_each: bool = False,
        extra_steps: int = 0,
    ) -> CascadeResult:
        """Climb the tiers of `candidates` with `call.body`, by `call.deadline_s`
        (`one_step_each`: each candidate is a step, a `select` route's chain;
        `extra_steps`: climbed beyond `max_escalations`, an exploring one's first try);
        `second_opinions` are the deployments to ask alongside the first step (those
        of the route that may be called now)."""
        steps = [[d] for d in candidates] if one_step_each else tier_groups(candidates)
        groups = steps[: call.route.max_escalations + 1 + extra_steps]
        ends_at = time.monotonic() + call.deadline_s
        opinions = None
        if second_opinions and len(groups) > 1 and worth_asking(call.endpoint, call.body):
            opinions = SecondOpinions(self._executor, self._accountant, self._metrics, call)
            opinions.ask(second_opinions)
        records: list[SpendRecord] = []
        graded = _Graded()
        try:
            final, scores, escalations, attempts, verdict = await self._climb(
                call, groups, ends_at, opinions, records, graded, judge_last=one_step_each
            )
        finally:
            if opinions is not None:
                await opinions.close()
        tally = None
        if opinions is not None:
            records += opinions.records
            tally = (opinions.agreeing, opinions.answered)
        records += graded.records
        judged = tuple(graded.scores)
        return CascadeResult(
            final, tuple(records), escalations, scores, tally, judged, attempts, verdict
        )

    async def _climb(
        self,
        call: Call,
        groups: list[list[DeploymentRuntime]],
        ends_at: float,
        opinions: SecondOpinions | None,
        records: list[SpendRecord],
        graded: _Graded,
        judge_last: bool = False,
    ) -> tuple[Completed, tuple[float, ...], int, int, str]:
        """Ask tier after tier while the verifier rejects the answer; the answer kept,
        the verifier's scores, the escalations (the tiers climbed to the answer
        kept: past rejected answers and past tiers that failed) and the upstream calls
        of every tier, failed ones included. `judge_last`: the last answer is verified
        too, for the record (a select route learns from it), never escalated. Every
        answer is priced into `records`, in order: a rejected one as soon as the next
        answer comes (until then, its escalation failing would make it the client's,
        the one judged against the route's SLA), the last and the first when the climb
        ends, however it ends. The first waits because its reference prices the tokens
        of the answer the client gets; a worker killed mid-climb loses only it (and an
        answer whose escalation is still running)."""
        scores: list[float] = []
        attempts = 0
        verdict = "unjudged"  # of the answer delivered (`x-cascade-verdict`)
        refused = False  # the latest answer is unusable and its escalation failed
        closing: asyncio.Task[None] | None = None  # the opinions' early close
        first: _Answer | None = None  # `<request id>`: priced when the climb ends
        latest: _Answer | None = None  # the last answer, not priced yet
        delivered = False  # whether `latest` is the client's answer
        endpoint, body = call.endpoint, call.body
        ask = endpoint == "chat" and not body.get("logprobs")  # else the client's say goes
        cut_off = self._accountant.cut_off_pricer(call)
        try:
            for step, group in enumerate(groups):
                verified = step < len(groups) - 1
                if not verified and opinions is not None:
                    # No answer is left for them to judge: closed while the last tier works.
                    closing = asyncio.create_task(opinions.close())
                try:
                    done = await self._executor.complete(
                        group,
                        endpoint,
                        body,
                        max(0.001, ends_at - time.monotonic()),
                        logprobs=ask and (verified or judge_last),  # judged alike
                        cut_off=cut_off,
                        native=call.native,
                    )
                except GatewayError as error:
                    attempts += error.attempts
                    error.attempts = attempts  # every tier's calls, for its headers
                    after = _after_failure(call, step, error, latest, verified, body)
                    if after == "escalate":
                        continue
                    refused = after == "refuse"
                    if after != "deliver" or latest is None:
                        raise
                    # The client gets it now, after the failed escalation: so its latency.
                    latest.answered_at, delivered = time.perf_counter(), True
                    verdict = "rejected"
                    break
                attempts += done.attempts
                # The answer before, rejected, is not the client's now that another came:
                # priced now (no await in between, so a cancel cannot skip it), unless it
                # is the first.
                if latest is not None and latest is not first:
                    records.append(self._settle(call, latest, delivered=False))
                n = 0 if latest is None else latest.n + 1
                latest = _Answer(done, step, n, time.perf_counter())
                first = first or latest
                await count_unreported(
                    call.prompt, endpoint, body, [(done.deployment, done.reply.body)]
                )
                if not verified:
                    if judge_last:
                        # A select's last step has nowhere to escalate, but its verdict is
                        # what learning lowers a candidate predicted best by: judged by the
                        # verifier alone (no judge call), delivered whatever it says.
                        latest.judged = self._verify(call, done.reply.body, (), None)
                        if latest.judged is not None:
                            verdict = _verdict(latest.judged, call)
                    delivered = True
                    break
                reply = done.reply.body
                samples, code_run = await self._evidence(call, reply, ends_at, opinions)
                latest.judged = self._verify(call, reply, samples, code_run)
                if call.route.judge is not None:
                    latest.judged = await self._graded(call, reply, ends_at, graded, latest.judged)
                score = 0.0 if latest.judged is None else latest.judged  # broke: escalate
                scores.append(score)
                self._metrics.child(self._metrics.verifier_score, call.route.name).observe(score)
                if score >= call.route.verify_threshold:
                    delivered, verdict = True, "accepted"
                    break
        finally:
            # Priced with their verdicts, however the climb ends: a request cancelled
            # while its answer is judged or escalated is priced all the same (and judged
            # as answered to nobody).
            if first is not None and latest is not None:
                self._settle_ends(call, first, latest, delivered, records, refused)
            if closing is not None:  # after the answer is priced: it is paid for
                await _finished(closing)
        assert latest is not None  # the first group either answered or raised
        final = without_logprobs(latest.done) if ask else latest.done
        return final, tuple(scores), latest.step, attempts, verdict

    async def _evidence(
        self,
        call: Call,
        reply: dict[str, Any],
        ends_at: float,
        opinions: SecondOpinions | None,
    ) -> tuple[Sequence[str], ExampleRun | None]:
        """What the verifier weighs besides the answer, gathered at once: the second
        opinions' answers and, where the route runs code, the answer's own examples."""

        async def samples() -> Sequence[str]:
            return await opinions.samples(reply, ends_at) if opinions else ()

        if not call.route.run_code_examples:  # no second task to run beside the opinions
            return await samples(), None

        async def code_run() -> ExampleRun | None:
            run, outcome = await run_code(call.endpoint, call.body, reply, ends_at)
            self._metrics.child(self._metrics.code_runs, call.route.name, outcome).inc()
            return run

        return await asyncio.gather(samples(), code_run())

    async def _graded(
        self,
        call: Call,
        reply: dict[str, Any],
        ends_at: float,
        graded: _Graded,
        verified: float | None,
    ) -> float | None:
        """The judge's score of `reply` when it gives one, else the verifier's."""
        n = len(graded.scores) + 1
        verdict = await self._judge.grade(call, reply, ends_at, n, graded.records)
        graded.scores.append(verdict.score)
        if decisions.isEnabledFor(logging.INFO):
            judge = call.route.judge.name if call.route.judge else None
            said = (
                f"graded {verdict.score:.3f} (from its {verdict.source})"
                if verdict.score is not None
                else f"{verdict.outcome}: the verifier's {_rounded(verified)} stands"
            )
            decisions.info(
                "%s judge '%s' (%s) on answer %d: %s",
                call.request_id,
                judge,
                RUBRIC_VERSION,
                n,
                said,
            )
        return verdict.score if verdict.score is not None else verified

    def _verify(
        self,
        call: Call,
        reply: dict[str, Any],
        samples: Sequence[str],
        code_run: ExampleRun | None = None,
    ) -> float | None:
        """The verifier's score; None when it broke on odd text: the answer is then
        rejected (escalate) rather than fail a request whose cheap answer is already
        paid for, and its record carries no verdict (it is none)."""
        try:
            return self._verifier(call.endpoint, call.body, reply, samples, code_run)
        except Exception:
            log.exception("verifier failed on %s; escalating", call.request_id)
            return None

    def _settle_ends(
        self,
        call: Call,
        first: _Answer,
        last: _Answer,
        delivered: bool,
        records: list[SpendRecord],
        refused: bool = False,
    ) -> None:
        """Price the first and the last answer of a climb that ended (the ones between,
        rejected, are priced already) into `records`, keeping them in order;
        `delivered`: the last is the one the client gets.

        The first carries the request's reference cost, priced on the delivered answer's
        tokens: what the client got, had the reference model written it. A rejected
        answer's length is no counterfactual (a truncated ramble escalated to a one-word
        answer would read as savings). Delivered nothing (cancelled), the first is
        priced on its own tokens. `refused`: the client got an error instead of `last`
        (unusable): no answer is the request's (`<request id>:r<n>`), so the request is
        recorded as the error it got, with no reference."""
        if refused:
            for answer in (first,) if last is first else (first, last):
                records.append(self._settle(call, answer, False, label=f"r{answer.n}"))
            return
        usage = self._usage(call, last)
        reference = usage if delivered else None
        own = usage if last is first else None
        delivered_first = delivered and last is first
        records.insert(0, self._settle(call, first, delivered_first, own, reference))
        if last is not first:
            records.append(self._settle(call, last, delivered, usage))

    def _settle(
        self,
        call: Call,
        answer: _Answer,
        delivered: bool,
        usage: Usage | None = None,
        reference: Usage | None = None,
        label: str | None = None,
    ) -> SpendRecord:
        """Price `answer` (the first is `<request id>`, the n-th after it
        `<request id>:<n>`, or `<request id>:<label>`), given by the `answer.step`-th
        tier (its escalations); `delivered`: it is the one the client gets; `usage`: its
        tokens, when already read; `reference`: the tokens its reference prices, when
        not its own."""
        return self._accountant.settle(
            call,
            answer.done.deployment,
            usage if usage is not None else self._usage(call, answer),
            attempt=answer.n,
            escalations=answer.step,
            verifier_score=answer.judged,
            answered_at=answer.answered_at,
            delivered=delivered,
            reference=reference,
            label=label,
        )

    @staticmethod
    def _usage(call: Call, answer: _Answer) -> Usage:
        done = answer.done
        return reply_usage(done.deployment, call.endpoint, call.body, done.reply.body, call.prompt)


@dataclass(slots=True)
class _Answer:
    """An answer of the climb: which tier gave it, when, and the verifier's verdict."""

    done: Completed
    step: int
    n: int  # its place among the climb's answers: 0 is `<request id>`, n `<request id>:<n>`
    answered_at: float  # perf_counter
    judged: float | None = None  # the verifier's score; None: not judged, or it broke


@dataclass(slots=True)
class _Graded:
    """The judge's work over one climb: its score of each answer, its calls priced."""

    scores: list[float | None] = dataclasses.field(default_factory=list)
    records: list[SpendRecord] = dataclasses.field(default_factory=list)


async def _finished(closing: asyncio.Task[None]) -> None:
    """Wait for the opinions' early close; its failure is logged (the cascade's own
    close, which always follows, tries again). Cancelled here, it is cut short, and
    that close finishes it."""
    try:
        await closing
    except Exception:
        log.exception("closing second opinions failed")


def _upstream_failed(error: GatewayError) -> bool:
    """The tier's deployments failed, were rate limited or lack a parameter the request
    sets (another tier may answer), as opposed to a request its upstream rejected
    (which every tier would)."""
    return error.status >= 500 or error.status == 429 or error.code == "unsupported_parameter"


def without_logprobs(done: Completed) -> Completed:
    """`done` with each choice's `logprobs` back to null, as the upstream answers when
    not asked; re-serialised only when some choice carried them (else its raw bytes go
    out unchanged)."""
    choices = done.reply.body.get("choices") or []
    if not any(isinstance(c, Mapping) and c.get("logprobs") is not None for c in choices):
        return done
    stripped = [{**c, "logprobs": None} if isinstance(c, Mapping) else c for c in choices]
    return dataclasses.replace(done, reply=UpstreamReply({**done.reply.body, "choices": stripped}))


def _rounded(score: float | None) -> str:
    return "none" if score is None else f"{score:.3f}"


def _verdict(score: float, call: Call) -> str:
    """A judged answer's verdict against the route's threshold (a select's last step:
    judged, and delivered whatever it says, as there is nowhere left to climb)."""
    return "accepted" if score >= call.route.verify_threshold else "rejected"


def _after_failure(
    call: Call,
    step: int,
    error: GatewayError,
    latest: _Answer | None,
    verified: bool,
    body: Mapping[str, Any],
) -> str:
    """What a tier's failure means for the climb: `escalate` (a tier that cannot answer
    counts as rejected: the next one is up), `raise` (no answer to fall back on),
    `refuse` (the last answer is unusable: broken, not doubtful, so the client gets the
    error) or `deliver` (the last answer, rejected, beats none)."""
    if latest is None and verified and _upstream_failed(error):
        log.warning("tier %d of %s failed (%s); escalating", step, call.request_id, error)
        return "escalate"
    if latest is None:
        return "raise"
    if unusable_answer(body, latest.done.reply.body):
        log.warning(
            "escalation %d of %s failed; its last answer is unusable", step, call.request_id
        )
        return "refuse"
    log.warning("escalation %d of %s failed; answering with the last answer", step, call.request_id)
    return "deliver"
