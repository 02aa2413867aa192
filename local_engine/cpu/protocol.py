"""OpenAI request bodies the CPU engine accepts, validated at the HTTP boundary.

Unknown fields are accepted and ignored, as vLLM does; fields this engine cannot honour
(`n` > 1, `logprobs`, `echo`, tools, token-id embedding input, other `dimensions`) are
rejected with a 400 naming them rather than silently dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from local_engine.cpu.sampling import SamplingParams

RoleType = Literal["system", "developer", "user", "assistant", "tool"]
EncodingFormatType = Literal["float", "base64"]
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit per request


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: RoleType
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationBody(BaseModel):
    """The fields chat and text completions share."""

    model_config = ConfigDict(extra="allow")

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="only one choice per request")
    logprobs: Literal[False, None] = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError(f"at most 4 stop sequences; got {len(value)}")
        return value

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=max_tokens,
            stop=tuple(stops),
            seed=self.seed,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionBody(GenerationBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: None = None

    def sampling_params(self) -> SamplingParams:
        return self.sampling(self.max_completion_tokens or self.max_tokens)


class CompletionBody(GenerationBody):
    prompt: str | list[str] | list[int]
    echo: Literal[False] = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(value, list) and value and isinstance(value[0], str) and len(value) != 1:
            raise ValueError(f"one prompt per request; got a list of {len(value)}")
        return value

    def sampling_params(self) -> SamplingParams:
        return self.sampling(16 if self.max_tokens is None else self.max_tokens)


class EmbeddingBody(BaseModel):
    """`/v1/embeddings`: one text or a list of texts (token ids are not accepted: the
    embedding model has its own tokenizer)."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[str] = Field(union_mode="left_to_right")
    encoding_format: EncodingFormatType = "float"
    dimensions: int | None = Field(None, ge=1)

    @field_validator("input")
    @classmethod
    def _some_text(cls, value: str | list[str]) -> str | list[str]:
        texts = [value] if isinstance(value, str) else value
        if not texts or len(texts) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"between 1 and {MAX_EMBEDDING_INPUTS} texts; got {len(texts)}")
        if any(not text for text in texts):
            raise ValueError("an input is empty; embed non-empty text")
        return value

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
