"""`make bench-client`: the bench's streaming client against vLLM's own, same stand-in, same run.

Starts the fast stand-in (tests/standin_fast.py) in its own process, then at each concurrency
sends the same workload (32 x concurrency streaming requests of 256 output tokens, ignore_eos)
with the kit's client (in this process) and with `vllm bench serve`'s client (vLLM 0.33.0, in a
child process, tokenizer built locally since nothing can be downloaded). Reports streamed
tokens/s, CPU seconds per 1,000 tokens, and the ratio. A benchmark, not a test: it asserts
nothing; targets are printed beside the figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serving.bench.client import Target, stream_chat

REPO = Path(__file__).resolve().parent.parent
OUTPUT_LEN = 256
MODEL = "local-inference-lab/GLM-5.3-Flash-NVFP4"
VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
VLLM_BENCH_RUNS_DONE = "vllm-bench-run-done"
VLLM_BENCH_RUNS = f"""
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
for line in sys.stdin:
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(json.loads(line)))
    print("\\n{VLLM_BENCH_RUNS_DONE}", flush=True)
"""
"""`vllm bench serve` once per line of JSON arguments on standard input, in one process that
imports vLLM once (an import costs 8-15 s on two cores), each run followed by a done line."""
TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "[EOS]": 1, **{f"w{i}": i + 2 for i in range(997)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")
fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
fast.save_pretrained(sys.argv[1])
"""


def start_standin() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "standin_fast.py")],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline().split()[-1])


async def kit_client(port: int, concurrency: int, requests: int) -> tuple[int, float, float]:
    target = Target(f"http://127.0.0.1:{port}")
    payload = json.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": "w1 w2 w3 w4 w5 w6 w7 w8"}],
        "max_tokens": OUTPUT_LEN, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }).encode()  # fmt: skip
    gate = asyncio.Semaphore(concurrency)

    async def one() -> int:
        async with gate:
            result = await stream_chat(target, payload, timeout=60)
            return result.completion_tokens if result.ok else 0

    cpu0, wall0 = time.process_time(), time.perf_counter()
    tokens = sum(await asyncio.gather(*(one() for _ in range(requests))))
    return tokens, time.perf_counter() - wall0, time.process_time() - cpu0


def vllm_client(
    port: int, concurrency: int, requests: int, tokenizer: Path
) -> tuple[int, float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    argv = [
        sys.executable, "-c", VLLM_BENCH, "--backend", "openai-chat",
        "--endpoint", "/v1/chat/completions", "--base-url", f"http://127.0.0.1:{port}",
        "--model", MODEL, "--tokenizer", str(tokenizer), "--dataset-name", "random",
        "--random-input-len", "8", "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
        "--ignore-eos", "--disable-tqdm", "--num-warmups", "0",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tok_s = float(re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", out.stdout)[1])
    tokens = int(re.search(r"Total generated tokens:\s+(\d+)", out.stdout)[1])
    # CPU of the whole child, including vLLM's import time: an upper bound on its client's cost.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return tokens, tokens / tok_s, cpu


def main() -> None:
    proc, port = start_standin()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer = Path(tmp) / "tokenizer"
            subprocess.run([sys.executable, "-c", TOKENIZER, str(tokenizer)], check=True)
            for concurrency in (16, 64):
                requests = 32 * concurrency
                kit = asyncio.run(kit_client(port, concurrency, requests))
                ref = vllm_client(port, concurrency, requests, tokenizer)
                rows.append((concurrency, kit, ref))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(
        f"streamed tokens/s and CPU seconds per 1,000 tokens; {OUTPUT_LEN}-token streams, "
        "32 x concurrency requests, fast stand-in on 127.0.0.1"
    )
    print(
        f"{'concurrency':>11}  {'kit tok/s':>10}  {'kit cpu/1k':>10}  {'vllm tok/s':>10}  "
        f"{'vllm cpu/1k':>11}  {'ratio':>6}"
    )
    for concurrency, (kt, kw, kc), (vt, vw, vc) in rows:
        print(
            f"{concurrency:>11}  {kt / kw:>10,.0f}  {kc / kt * 1000:>10.4f}  {vt / vw:>10,.0f}  "
            f"{vc / vt * 1000:>11.4f}  {(kt / kw) / (vt / vw):>5.1f}x"
        )
    print("target: kit >= 50,000 tok/s on one core (a GPU server streams a few thousand at "
          "these concurrencies; make e2e checks the kit's figures equal vllm bench serve's)")
    print("(vllm cpu/1k includes its process start-up and imports; its tok/s is what it reports)")


if __name__ == "__main__":
    main()
