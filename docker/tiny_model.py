"""Make the CPU profile's model: a two-layer Llama that answers the smoke check's prompts.

No weights can be downloaded on the machines that test this kit, so the CPU image trains its own
model at build time: a byte-level BPE tokenizer learnt from the smoke prompts, a chat template,
and a 2-layer, 128-wide Llama trained (seeded, a few hundred steps on the CPU) until greedy
decoding reproduces every answer. The build then checks those answers with transformers, so an
image whose model does not answer is never produced. The prompts come from `smoke.api`: the model
learns exactly what the smoke check asks.

    python docker/tiny_model.py --out /opt/models/kit-tiny-chat
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<|end|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
EOS = "<|end|>"
SEED = 20261201
MAX_POSITIONS = 4_194_304
"""Position limit in config.json, far above any length served, so that a start asked for more
context than its KV cache holds fails on the cache (the check the e2e run makes), not here."""

NUMBER_WORDS = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]


def count_words(limit: int = 100) -> list[str]:
    """'one' .. 'one hundred' in words."""
    tens = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    words = list(NUMBER_WORDS)
    for t in tens:
        words.append(t)
        words += [f"{t}-{u}" for u in NUMBER_WORDS[:9]]
    words.append("one hundred")
    return words[:limit]


def conversations() -> list[tuple[str, str]]:
    """(user prompt, exact answer) pairs the model must reproduce under greedy decoding."""
    from smoke.api import LENGTH_PROMPT, READY_PROMPT

    return [
        (READY_PROMPT, "READY"),
        (LENGTH_PROMPT, ", ".join(count_words())),
        ("hello", "Hello! " + " ".join(count_words(40))),
    ]


def render(prompt: str) -> str:
    return f"<|user|>{prompt}<|end|><|assistant|>"


def train_tokenizer(texts: list[str]):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build(out: Path, steps: int = 400) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(SEED)
    pairs = conversations()
    raw = train_tokenizer([render(p) + a + EOS for p, a in pairs] * 4)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=EOS, pad_token="<|pad|>", chat_template=CHAT_TEMPLATE
    )
    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        eos_token_id=raw.token_to_id(EOS),
        pad_token_id=raw.token_to_id("<|pad|>"),
        bos_token_id=None,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    batch = []
    for prompt, answer in pairs:
        head = raw.encode(render(prompt)).ids
        tail = raw.encode(answer + EOS).ids
        ids = torch.tensor(head + tail)
        labels = ids.clone()
        labels[: len(head)] = -100  # learn the answers, not the prompts
        batch.append((ids, labels))
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        for ids, labels in batch:
            loss = model(input_ids=ids[None], labels=labels[None]).loss
            loss.backward()
            optim.step()
            optim.zero_grad()
    model.eval()
    failures = check(model, tokenizer, pairs)
    if failures:
        sys.exit("tiny model does not reproduce its answers:\n" + "\n".join(failures))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "kit-tiny-model.json").write_text(
        json.dumps({"seed": SEED, "steps": steps, "answers": dict(pairs)}, indent=2) + "\n"
    )
    print(f"tiny chat model written to {out} (final loss {loss.item():.4f})")


def check(model, tokenizer, pairs: list[tuple[str, str]]) -> list[str]:
    """Greedy answers through the chat template, compared with the training answers."""
    import torch

    failures = []
    for prompt, answer in pairs:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
        )
        if not isinstance(ids, torch.Tensor):
            ids = ids["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=len(answer) + 8, do_sample=False)
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        if text != answer:
            failures.append(f"  {prompt!r}: got {text!r}, want {answer!r}")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    build(args.out, args.steps)


if __name__ == "__main__":
    main()
