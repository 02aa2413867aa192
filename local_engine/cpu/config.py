"""The model shape, read from a Hugging Face Llama `config.json`.

config = LlamaConfig.from_dict(json.loads(path.read_text()))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from local_engine.cpu.errors import CheckpointError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
SUPPORTED_ACTIVATIONS = ("silu",)


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of HF's `LlamaConfig` that the forward pass uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    torch_dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LlamaConfig:
        architectures = raw.get("architectures") or list(SUPPORTED_ARCHITECTURES)
        if not set(architectures) & set(SUPPORTED_ARCHITECTURES):
            raise CheckpointError(
                f"config.json has architectures {architectures}; supported: "
                f"{list(SUPPORTED_ARCHITECTURES)}"
            )
        act = raw.get("hidden_act", "silu")
        if act not in SUPPORTED_ACTIVATIONS:
            raise CheckpointError(f"config.json has hidden_act {act!r}; supported: 'silu'")
        if raw.get("rope_scaling"):
            raise CheckpointError(
                f"config.json has rope_scaling {raw['rope_scaling']!r}; "
                "only plain RoPE is supported"
            )
        eos = raw.get("eos_token_id")
        try:
            config = cls(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=int(raw["num_attention_heads"]),
                num_key_value_heads=int(
                    raw.get("num_key_value_heads") or raw["num_attention_heads"]
                ),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(raw.get("rope_theta", 10000.0)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_id=eos[0] if isinstance(eos, list) else eos,
                torch_dtype=str(raw.get("torch_dtype", "float32")),
            )
        except KeyError as exc:
            raise CheckpointError(f"config.json lacks the field {exc.args[0]!r}") from exc
        config.check()
        return config

    def check(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The HF `config.json` form."""
        return {
            "architectures": list(SUPPORTED_ARCHITECTURES),
            "model_type": "llama",
            "hidden_act": "silu",
            **asdict(self),
        }
