"""Load and save Hugging Face Llama checkpoints: `config.json` plus `*.safetensors`.

    model = load_model(Path("local_engine/models/tiny-target"))
    save_model(model, out_dir, dtype=torch.bfloat16)

Weights are cast to float32 on load (the dtype CPU matmuls are fast in); a checkpoint
may be stored in any floating dtype. Sharded checkpoints (`model-00001-of-00002...`)
load the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from local_engine.cpu.config import LlamaConfig
from local_engine.cpu.errors import CheckpointError
from local_engine.cpu.model import LlamaForCausalLM

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TIED_HEAD = "lm_head.weight"


def load_config(directory: Path) -> LlamaConfig:
    path = directory / CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"{path} does not exist; a model directory holds {CONFIG_FILE}"
        ) from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    return LlamaConfig.from_dict(raw)


def load_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file, device="cpu"))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{file} cannot be read as safetensors: {exc}") from exc
    return state


def load_model(directory: Path, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """The model in `directory`, in eval mode, weights cast to `dtype`."""
    config = load_config(directory)
    state = load_state_dict(directory)
    # HF checkpoints carry a rotary inv_freq buffer in some versions; it is recomputed here.
    state = {name: tensor for name, tensor in state.items() if "rotary_emb" not in name}
    if config.tie_word_embeddings:
        state.pop(TIED_HEAD, None)
    model = LlamaForCausalLM(config)
    expected = set(model.state_dict()) - ({TIED_HEAD} if config.tie_word_embeddings else set())
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise CheckpointError(
            f"{directory}: weights do not match a Llama of this config.json; "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    for name, tensor in state.items():
        want = model.state_dict()[name].shape
        if tensor.shape != want:
            raise CheckpointError(
                f"{directory}: {name} has shape {list(tensor.shape)}; config.json implies "
                f"{list(want)}"
            )
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    return model.to(dtype).eval()


def save_model(
    model: LlamaForCausalLM, directory: Path, dtype: torch.dtype = torch.float32
) -> None:
    """Write `config.json` and `model.safetensors` (tied heads stored once, as HF does)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict() | {"torch_dtype": str(dtype).removeprefix("torch.")}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    state = {
        name: tensor.detach().to(dtype).contiguous()
        for name, tensor in model.state_dict().items()
        if not (model.config.tie_word_embeddings and name == TIED_HEAD)
    }
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
