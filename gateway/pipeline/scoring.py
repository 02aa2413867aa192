"""The router's models applied to request and reply bodies: the complexity score of a
request (classifier routes) and the acceptability of an answer (cascade routes).

The shipped models (and numpy, which they need) are loaded on first use (routes that
need neither never pay for them) and kept; both score in well under a millisecond, so
they run inline. The embedding classifier (a route's `classifier: minilm`) takes tens of
milliseconds, so it runs in a worker thread (`RequestScorer.score`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gateway.errors import ClassifierUnavailable
from gateway.pipeline.selector import profile_problems
from gateway.request import asked_tokens, choices_of
from gateway.runtime import RouteRuntime
from gateway.upstreams.base import EndpointType
from policies.document import FieldPath
from policies.sections import Sections
from router import SCORED_STRATEGIES, conversation
from router.errors import RoutingError
from router.installed import minilm_classifier_missing
from router.verifier_features import breaks_format

if TYPE_CHECKING:
    from router.classifier import Classifier, RequestClassifier
    from router.code_examples import ExampleRun
    from router.verifier import Verifier


def request_messages(endpoint: EndpointType, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Chat messages of any request: a completion's prompt is one user message."""
    if endpoint == "chat":
        return list(body.get("messages") or [])
    prompt = body.get("prompt") if endpoint == "completions" else body.get("input")
    text = (
        prompt
        if isinstance(prompt, str)
        else " ".join(p for p in prompt or [] if isinstance(p, str))
    )
    return [{"role": "user", "content": text}]


log = logging.getLogger(__name__)

# One thread: an embedding is CPU-bound (torch spreads one call over its own threads),
# so requests queue for it rather than oversubscribe the cores.
_EMBEDDING_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minilm")
# The shipped models load once: a request that needs one while the warm-up thread is
# loading it waits for that load rather than doing it again (functools.cache does not).
_LOADING = threading.Lock()
_MODELS: dict[str, Any] = {}


class RequestScorer:
    """`scorer(endpoint, body, classifier) -> float` in [0, 1]: how much the request
    needs a strong model, by the route's `classifier` (`features`, the default, or
    `minilm`: tens of ms, so the proxy calls it from a worker thread)."""

    def __init__(self, classifier: Classifier | None = None) -> None:
        self._classifier = classifier  # the `features` model (default: the shipped one)

    def __call__(
        self, endpoint: EndpointType, body: Mapping[str, Any], classifier: str = "features"
    ) -> float:
        model: RequestClassifier = (
            shipped_embedding_classifier()
            if classifier == "minilm"
            else self._classifier or shipped_classifier()
        )
        response_format = body.get("response_format")
        tools = body.get("tools")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        return model.score(
            request_messages(endpoint, body),
            tools=tools if isinstance(tools, list) else None,
            response_format=response_format if isinstance(response_format, Mapping) else None,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        )

    async def score(
        self, endpoint: EndpointType, body: Mapping[str, Any], classifier: str = "features"
    ) -> float:
        """The score, from the event loop: inline, or in the embedding thread (where a
        request waits its turn; the proxy counts the wait against its deadline)."""
        if classifier == "features":
            return self(endpoint, body)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(_EMBEDDING_THREAD, self, endpoint, body, classifier)
        except RoutingError as exc:  # the policy passed the check, then the model failed
            raise ClassifierUnavailable(f"the route's classifier '{classifier}': {exc}") from exc


def classifier_problem(name: str) -> str | None:
    """Why the route classifier `name` cannot run in this install, or None; loads
    nothing heavy."""
    return minilm_classifier_missing() if name == "minilm" else None


def install_problems(sections: Sections) -> Iterator[tuple[FieldPath, str]]:
    """What of a policy this install cannot serve: routes whose classifier cannot run
    here, deployments whose quality profile the predictor does not know. The policy
    loader's `install_check`."""
    for name, route in (sections.routes or {}).items():
        if route is not None and (problem := classifier_problem(route.classifier)):
            yield ("routes", name, "classifier"), problem
    yield from profile_problems(sections)


def warm(routes: Iterable[RouteRuntime], threads: int | None = None) -> Future[None] | None:
    """Load the models the routes use in threads, off the event loop: a policy (re)load
    then never blocks, and the first request waits only for what is left. The shipped
    classifier, verifier and quality predictor (and numpy) load in a daemon thread; the embedding
    classifier in its own thread, whose future is returned. `threads`: the CPU threads
    it may use (`Settings.embedding_threads`). A failure is logged here and answered 503
    on the route's requests."""
    routes = list(routes)
    verifies = any(route.strategy == "cascade" or route.verify for route in routes)
    selects = any(route.strategy == "select" for route in routes)
    if verifies or selects or any(route.strategy in SCORED_STRATEGIES for route in routes):
        threading.Thread(target=_load_shipped, args=(verifies, selects), daemon=True).start()
    if any(route.classifier == "minilm" for route in routes):
        return _EMBEDDING_THREAD.submit(_load_embedding_classifier, threads)
    return None


def _load_shipped(verifier: bool, predictor: bool) -> None:
    try:
        shipped_classifier()
        if verifier:
            shipped_verifier()
        if predictor:
            from router.quality import shipped

            shipped()
    except Exception as exc:  # the first request that needs them reports it
        log.error("the router's shipped models cannot load: %s", exc)


def _load_embedding_classifier(threads: int | None) -> None:
    from router import embeddings

    try:
        embeddings.load(threads)
        shipped_embedding_classifier()
    except RoutingError as exc:
        log.error("the embedding classifier (classifier: minilm) cannot load: %s", exc)


def prompt_text(endpoint: EndpointType, body: Mapping[str, Any]) -> str:
    """The conversation as one text, for the verifier (`router.conversation`)."""
    return conversation.prompt_text(request_messages(endpoint, body))


def question_text(endpoint: EndpointType, body: Mapping[str, Any]) -> str:
    """The user's turns as one text (`router.conversation`): what kind of question a
    request asks is read from them, not from the route's system prompt every request on
    it shares; the whole conversation when no user turn says anything."""
    return conversation.question_text(request_messages(endpoint, body))


def answer_parts(reply: Mapping[str, Any]) -> tuple[str, list[float] | None, str | None]:
    """The first choice's text, token logprobs (when the upstream sent them), and
    finish reason."""
    choices = reply.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    message = choice.get("message") or {}
    text = message.get("content") if isinstance(message, Mapping) else None
    text = text if isinstance(text, str) else str(choice.get("text") or "")
    logprobs = None
    content = (
        (choice.get("logprobs") or {}).get("content")
        if isinstance(choice.get("logprobs"), Mapping)
        else None
    )
    if isinstance(content, list):
        logprobs = [
            float(t["logprob"]) for t in content if isinstance(t, Mapping) and "logprob" in t
        ]
    return text, logprobs, choice.get("finish_reason")


# What an answer may hold besides text: a tool call (or a legacy function call), a
# structured output's refusal, audio.
ANSWER_PARTS = ("tool_calls", "function_call", "refusal", "audio")


def unusable_answer(body: Mapping[str, Any], reply: Mapping[str, Any]) -> bool:
    """Broken, not doubtful: nothing at all (no text, tool call, refusal or audio), or
    JSON that breaks a format the API would have guaranteed (`json_object`, or a
    `json_schema` with `strict: true`). A client is better served by an error (which its
    SDK retries) than by such an answer."""
    choices = reply.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    message = choice.get("message")
    if isinstance(message, Mapping) and any(message.get(part) for part in ANSWER_PARTS):
        return False
    text, _, _ = answer_parts(reply)
    return not text.strip() or breaks_format(text, _guaranteed(body.get("response_format")))


def _guaranteed(response_format: Any) -> Mapping[str, Any] | None:
    """The `response_format` whose JSON the API guarantees, if the request set one."""
    if not isinstance(response_format, Mapping):
        return None
    if response_format.get("type") == "json_object":
        return response_format
    schema = response_format.get("json_schema")
    strict = isinstance(schema, Mapping) and schema.get("strict") is True
    return response_format if response_format.get("type") == "json_schema" and strict else None


def reached_request_limit(
    endpoint: EndpointType, body: Mapping[str, Any], reply: Mapping[str, Any]
) -> bool:
    """Did the answers run to the output limit of the request itself (the `max_tokens` /
    `max_completion_tokens` every tier is sent: the client's, or the route's
    `max_output_tokens` a budget sends), by the usage the upstream reports? An answer
    cut sooner was cut by something else, which another tier may not have: a
    deployment's lower `max_output_tokens`, its model's context."""
    limit = asked_tokens(body)
    usage = reply.get("usage")
    if limit is None or not isinstance(usage, Mapping):
        return False
    completion = usage.get("completion_tokens")
    if not isinstance(completion, int) or isinstance(completion, bool):
        return False
    return completion >= limit * choices_of(endpoint, body)


class AnswerVerifier:
    """`verifier(endpoint, body, reply) -> float` in [0, 1]: how likely the answer is
    acceptable; one that the request's own token limit cut (`reached_request_limit`)
    is not judged truncated. The model is loaded on first use and kept."""

    def __init__(
        self, verifier: Verifier | None = None, scorer: RequestScorer | None = None
    ) -> None:
        self._verifier = verifier
        self._scorer = scorer or RequestScorer()

    def __call__(
        self,
        endpoint: EndpointType,
        body: Mapping[str, Any],
        reply: Mapping[str, Any],
        samples: Sequence[str] = (),
        code_run: ExampleRun | None = None,
    ) -> float:
        """``samples``: other answers to the same request (second opinions' texts);
        ``code_run``: the answer's code run against its own examples (``run_code``)."""
        verifier = self._verifier or shipped_verifier()
        text, logprobs, finish_reason = answer_parts(reply)
        if finish_reason == "length" and reached_request_limit(endpoint, body, reply):
            # Cut where the request asked (max_tokens: 1 to classify): not the answer's
            # fault, and every tier would be cut alike. The rest of the verdict stands.
            finish_reason = None
        response_format = body.get("response_format")
        return verifier.score(
            prompt_text(endpoint, body),
            text,
            logprobs=logprobs,
            response_format=response_format if isinstance(response_format, dict) else None,
            finish_reason=finish_reason if isinstance(finish_reason, str) else None,
            prompt_score=self._scorer(endpoint, body),  # the router's prior on the prompt
            samples=samples,
            question=question_text(endpoint, body),
            code_run=code_run,
        )


def shipped_classifier() -> Classifier:
    from router.classifier import Classifier

    loaded: Classifier = _shipped("classifier", Classifier.load)
    return loaded


def shipped_embedding_classifier() -> RequestClassifier:
    from router import embedding_classifier

    return embedding_classifier.shipped()  # cached there


def shipped_verifier() -> Verifier:
    from router.verifier import Verifier

    loaded: Verifier = _shipped("verifier", Verifier.load)
    return loaded


def _shipped(name: str, load: Callable[[], Any]) -> Any:
    """The model `name`, loaded once per process by whichever thread asks first."""
    model = _MODELS.get(name)
    if model is None:
        with _LOADING:  # the warm-up thread's load, or this one's: never both
            model = _MODELS.get(name)
            if model is None:
                model = _MODELS[name] = load()
    return model
