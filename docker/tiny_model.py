"""Make the CPU profile's model: a two-layer Llama that answers the smoke check's prompts.

No weights can be downloaded on the machines that test this kit, so the CPU image trains its own
model at build time: a byte-level BPE tokenizer learnt from the smoke prompts, a chat template,
and a 2-layer, 128-wide Llama trained (seeded, a few hundred steps on the CPU) until greedy
decoding reproduces every answer. The build then checks those answers with transformers, so an
image whose model does not answer is never produced. The prompts come from `smoke.api` and
`smoke.agent_api`: the model learns exactly what the smoke check asks, in GLM's formats, so that
vLLM's own `glm45` reasoning parser and `glm47` tool parser run on its output: thinking as
`<think>...</think>` (skipped when `enable_thinking` is false, as GLM-4.x's template does), tool
calls as `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`.

    python docker/tiny_model.py --out /opt/models/kit-tiny-chat
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% if tools %}<|system|>tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)
"""GLM-4.x's shape: tools named in a system turn, and `enable_thinking=false` closes an empty
think block so the model answers at once."""
SPECIAL = ["<|end|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
EOS = "<|end|>"
SEED = 20261201
TRAINED_LAYERS = 2
SERVED_LAYERS = 8
SERVED_INTERMEDIATE = 16384
"""Served shape: KV cache per token = 8 layers x (K + V) x 4 heads x 32 dims x 4 bytes = 8 KiB,
the figure profile cpu-tiny's expectations are computed from."""
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


@dataclass(frozen=True)
class Conversation:
    """A request as the smoke check sends it, and the exact text the model must answer."""

    prompt: str
    answer: str
    thinking: bool = True
    tools: tuple[dict, ...] = ()

    def render(self) -> str:
        from jinja2 import Environment

        return Environment().from_string(CHAT_TEMPLATE).render(
            messages=[{"role": "user", "content": self.prompt}],
            tools=list(self.tools) or None,
            add_generation_prompt=True,
            enable_thinking=self.thinking,
        )


def conversations() -> list[Conversation]:
    """What the model must reproduce under greedy decoding."""
    from smoke.agent_api import STRUCTURED_PROMPT, TOOL_CITY, TOOL_PROMPT, WEATHER_TOOL
    from smoke.api import LENGTH_PROMPT, READY_PROMPT
    from smoke.tool_edges import TIME_PROMPT, TIME_TOOL

    call = (f"<tool_call>{WEATHER_TOOL['function']['name']}<arg_key>city</arg_key>"
            f"<arg_value>{TOOL_CITY}</arg_value></tool_call>")  # fmt: skip
    # a call without arguments: the name alone between the tags (glm47's format)
    bare_call = f"<tool_call>{TIME_TOOL['function']['name']}</tool_call>"
    return [
        Conversation(READY_PROMPT, "READY", thinking=False),
        Conversation(READY_PROMPT, "<think>One word is asked for.</think>READY"),
        Conversation(LENGTH_PROMPT, ", ".join(count_words()), thinking=False),
        Conversation("hello", "Hello! " + " ".join(count_words(40)), thinking=False),
        Conversation("hello", "<think>A greeting.</think>Hello! " + " ".join(count_words(40))),
        Conversation(
            TOOL_PROMPT, "<think>The weather needs the tool.</think>" + call, tools=(WEATHER_TOOL,)
        ),
        Conversation(
            TIME_PROMPT, "<think>The time needs the tool.</think>" + bare_call, tools=(TIME_TOOL,)
        ),
        Conversation(STRUCTURED_PROMPT, '{"answer": "READY"}', thinking=False),
    ]


def train_tokenizer(texts: list[str]):  # -> tokenizers.Tokenizer
    """Byte-level BPE on the conversations; GLM's reasoning and tool-call tags are single tokens
    kept in decoded text (not special), as vLLM's GLM parsers read them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from smoke.tool_edges import GLM_MARKUP

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
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GLM_MARKUP])
    return tok


def build(out: Path, steps: int = 800) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(SEED)
    pairs = conversations()
    raw = train_tokenizer([c.render() + c.answer + EOS for c in pairs] * 4)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=EOS, pad_token="<|pad|>", chat_template=CHAT_TEMPLATE
    )
    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=TRAINED_LAYERS,
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
    for c in pairs:
        head = raw.encode(c.render()).ids
        tail = raw.encode(c.answer + EOS).ids
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
    model = with_ballast(model, SERVED_LAYERS, SERVED_INTERMEDIATE)
    failures = check(model, tokenizer, pairs)
    if failures:
        sys.exit("ballast changed the model's answers:\n" + "\n".join(failures))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "kit-tiny-model.json").write_text(
        json.dumps(
            {
                "seed": SEED,
                "steps": steps,
                "trained_layers": TRAINED_LAYERS,
                "ballast": "layers past trained_layers and MLP neurons past the trained width "
                "have zero output projections",
                "answers": [dataclasses.asdict(c) for c in pairs],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"tiny chat model written to {out} (final loss {loss.item():.4f})")


def with_ballast(model, layers: int, intermediate: int):  # -> LlamaForCausalLM
    """The trained model widened and deepened without changing a single output.

    Extra MLP neurons of the trained layers get random gate/up rows and zero down_proj columns;
    extra layers get random attention and MLP inputs and zero o_proj and down_proj. Each added
    term is multiplied by an exact zero before it reaches the residual stream."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    trained = model.config.num_hidden_layers
    config = LlamaConfig(
        **{**model.config.to_dict(), "num_hidden_layers": layers, "intermediate_size": intermediate}
    )
    served = LlamaForCausalLM(config)
    state = served.state_dict()
    with torch.no_grad():
        for name, weight in model.state_dict().items():
            target = state[name]
            if target.shape == weight.shape:
                target.copy_(weight)
            elif name.endswith("mlp.down_proj.weight"):
                target.zero_()
                target[:, : weight.shape[1]].copy_(weight)
            else:  # gate_proj / up_proj: the trained rows first
                target[: weight.shape[0]].copy_(weight)
        for i in range(trained, layers):
            state[f"model.layers.{i}.self_attn.o_proj.weight"].zero_()
            state[f"model.layers.{i}.mlp.down_proj.weight"].zero_()
    served.load_state_dict(state)
    return served.eval()


def check(model, tokenizer, pairs: list[Conversation]) -> list[str]:
    """Greedy answers through the chat template, compared with the training answers."""
    import torch

    failures = []
    for c in pairs:
        ids = tokenizer(c.render(), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=len(c.answer) + 8, do_sample=False)
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        if text != c.answer:
            failures.append(f"  {c.prompt!r} (thinking {c.thinking}): got {text!r}, "
                            f"want {c.answer!r}")  # fmt: skip
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=800)
    args = parser.parse_args()
    build(args.out, args.steps)


if __name__ == "__main__":
    main()
