"""Train the shipped tiny model pair: `python -m local_engine.cpu.train_tiny`.

Deterministic (fixed seeds, fixed step counts; same torch and thread count give the same
weights) and offline: the text is the routing data the router ships, `router/data` (GSM8K
questions with GPT-4's worked answers, RouterBench prompts with the models' responses),
rendered with the chat template, so the models learn the template and end replies with
`<|end|>`. Rows whose id hashes into the last 5% are held out for perplexity.

Writes `tiny-target/` and `tiny-draft/` (config.json, model.safetensors in bfloat16,
tokenizer.json, training.json with the held-out figures) under local_engine/models/.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

import torch
import torch.nn.functional as F

from local_engine.cpu.checkpoint import load_model, save_model
from local_engine.cpu.config import LlamaConfig
from local_engine.cpu.model import LlamaForCausalLM
from local_engine.cpu.server import DEFAULT_DRAFT, DEFAULT_MODEL
from local_engine.cpu.tokenizer import TOKENIZER_FILE, Tokenizer

log = logging.getLogger("local_engine")

# The routing data the router ships (`router.training.dataset`'s files, read here as files: the
# engine imports no router code). STEM.jsonl.gz as shipped, or plain STEM.jsonl.
DATA_DIR = Path(__file__).resolve().parents[2] / "router" / "data"
VOCAB_SIZE = 1024
CONTEXT = 512
HELD_OUT_PERCENT = 5
MIN_EXTRA_ANSWER = 40
RESPONDERS = ("gpt-4-1106-preview", "gpt-3.5-turbo-1106", "claude-v2", "mistralai/mistral-7b-chat")


@dataclass(frozen=True)
class Recipe:
    """One model's shape and schedule."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    steps: int
    batch_size: int = 16
    block: int = 256
    lr: float = 3e-3
    seed: int = 0

    def config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=CONTEXT,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        )


TARGET = Recipe(256, 640, 4, 4, 2, steps=700)
DRAFT = Recipe(128, 320, 1, 2, 1, steps=1000)


def documents(data_dir: Path) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """(row id, chat messages) for every usable question/answer pair."""
    for row in _rows(_data_file(data_dir, "gsm8k")):
        if row.get("strong_response"):
            yield row["id"], _chat(row["prompt"], row["strong_response"])
    stems = {p.name.split(".")[0] for p in data_dir.glob("routerbench_*.jsonl*")}
    for stem in sorted(stems):
        for row in _rows(_data_file(data_dir, stem)):
            for rank, name in enumerate(RESPONDERS):
                answer = _response(row.get("models", {}).get(name, {}).get("response"))
                # One letter answers (ARC, Winogrande) teach little: keep the first responder's.
                if answer and (rank == 0 or len(answer) >= MIN_EXTRA_ANSWER):
                    yield f"{row['id']}:{name}", _chat(row["prompt"][-800:], answer)


def _data_file(directory: Path, stem: str) -> Path:
    """`STEM.jsonl`, else `STEM.jsonl.gz` (as shipped); the plain name when neither is
    there, for the error."""
    plain = directory / f"{stem}.jsonl"
    packed = directory / f"{stem}.jsonl.gz"
    return packed if not plain.is_file() and packed.is_file() else plain


def _open_data(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    with _open_data(path) as lines:
        for line in lines:
            yield json.loads(line)


def _chat(prompt: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt.strip()}, {"role": "assistant", "content": answer}]


def _response(raw: Any) -> str:
    """RouterBench stores a response as a list of strings written as text, JSON or Python."""
    if not isinstance(raw, str):
        return ""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        try:
            parsed = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return raw.strip()
    return str(parsed[0]).strip() if isinstance(parsed, list) and parsed else ""


def held_out(row_id: str) -> bool:
    base = row_id.split(":")[0]
    return int(hashlib.sha256(base.encode()).hexdigest(), 16) % 100 < HELD_OUT_PERCENT


def encode_split(tokenizer: Tokenizer, docs: list[list[dict[str, str]]]) -> torch.Tensor:
    ids: list[int] = []
    for messages in docs:
        ids.extend(tokenizer.encode(tokenizer.render_chat(messages[:1]) + messages[1]["content"]))
        ids.append(tokenizer.eos_id)
    return torch.tensor(ids, dtype=torch.long)


def train(recipe: Recipe, data: torch.Tensor) -> LlamaForCausalLM:
    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(recipe.config())
    for name, param in model.named_parameters():
        if param.dim() == 2:
            torch.nn.init.normal_(param, std=0.02 if "embed" in name else 0.02 / math.sqrt(2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.1)
    batches = torch.Generator().manual_seed(recipe.seed)
    started = time.perf_counter()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr(recipe, step)
        starts = torch.randint(
            0, len(data) - recipe.block - 1, (recipe.batch_size,), generator=batches
        )
        window = torch.stack([data[s : s + recipe.block + 1] for s in starts.tolist()])
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == recipe.steps - 1:
            log.info("step %d loss %.3f (%.0f s)", step, loss.item(), time.perf_counter() - started)
    return model.eval()


def _lr(recipe: Recipe, step: int) -> float:
    warmup = 100
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, recipe.steps - warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.inference_mode()
def evaluate(model: LlamaForCausalLM, data: torch.Tensor, text_bytes: int) -> dict[str, float]:
    """Held-out loss per token, perplexity and bits per byte of text, over CONTEXT windows."""
    total, count = 0.0, 0
    for start in range(0, len(data) - 1, CONTEXT):
        window = data[start : start + CONTEXT + 1]
        logits = model(window[None, :-1])[0]
        total += float(F.cross_entropy(logits, window[1:], reduction="sum"))
        count += len(window) - 1
    return {
        "loss": total / count,
        "perplexity": math.exp(total / count),
        "bits_per_byte": total / math.log(2) / text_bytes,
        "tokens": count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m local_engine.cpu.train_tiny")
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--target-out", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--draft-out", type=Path, default=DEFAULT_DRAFT)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply step counts")
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    docs = list(documents(args.data))
    train_docs = [messages for row_id, messages in docs if not held_out(row_id)]
    eval_docs = [messages for row_id, messages in docs if held_out(row_id)]
    tokenizer = Tokenizer.train(
        (tokenizer_text for messages in train_docs for tokenizer_text in _texts(messages)),
        VOCAB_SIZE,
    )
    train_ids, eval_ids = encode_split(tokenizer, train_docs), encode_split(tokenizer, eval_docs)
    eval_bytes = sum(len(text.encode()) for messages in eval_docs for text in _texts(messages))
    log.info("%d train tokens, %d held-out tokens", len(train_ids), len(eval_ids))
    for recipe, out in ((TARGET, args.target_out), (DRAFT, args.draft_out)):
        scaled = Recipe(**(asdict(recipe) | {"steps": max(1, int(recipe.steps * args.scale))}))
        started = time.perf_counter()
        model = train(scaled, train_ids)
        seconds = time.perf_counter() - started
        model.config = replace(
            model.config, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id
        )
        save_model(model, out, dtype=torch.bfloat16)
        tokenizer.save(out / TOKENIZER_FILE)
        shipped = load_model(out)  # the figures are for the bf16 weights actually shipped
        card = {
            "recipe": asdict(scaled),
            "parameters": sum(p.numel() for p in shipped.parameters()),
            "train_tokens": len(train_ids),
            "train_seconds": round(seconds, 1),
            "threads": args.threads,
            "held_out": evaluate(shipped, eval_ids, eval_bytes),
        }
        (out / "training.json").write_text(json.dumps(card, indent=2) + "\n")
        log.info("%s: %s", out.name, json.dumps(card))


def _texts(messages: list[dict[str, str]]) -> Iterator[str]:
    return (message["content"] for message in messages)


if __name__ == "__main__":
    main()
