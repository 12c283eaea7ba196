"""What structured output costs per token: llguidance's mask over SmolLM2's vocabulary (49,152 tokens, from
its GGUF file) and Qwen's (151,936, tests/real_vocab.py), as framework/serve/structured.py computes it.

    python benchmarks/structured_mask.py [--repeats 5]

For each vocabulary: building llguidance's tokenizer (once per model), compiling a JSON schema and a GBNF
grammar (once per request), and the mask of every step (llguidance's bitmask unpacked to one bool per
token, what the sampler reads), while a valid answer is forced through the matcher token by token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import llguidance as llg  # noqa: E402

from framework.model.default import model_path  # noqa: E402
from framework.model.model import Model  # noqa: E402
from framework.model.tokenizer import tokenizer_from_metadata  # noqa: E402
from framework.serve.structured import JSON_LAYOUT, Grammar, GrammarMask, ll_tokenizer  # noqa: E402

SCHEMA = {"type": "object", "required": ["name", "tags", "address"], "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "required": ["city", "zip"],
                "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}}}}
ANSWER = {"name": "Ada Lovelace, Countess of Lovelace", "tags": ["mathematics", "poetry", "engines"],
          "address": {"city": "London, St James's Square", "zip": 12345}}
GBNF = 'root ::= item ("," item)*\nitem ::= [a-z]+ " " [0-9]+'
GBNF_TEXT = "apples 12,pears 3,plums 45,cherries 6,figs 78,dates 9"


def vocabularies():
    yield "SmolLM2 (GGUF)", Model(model_path("smollm2")).tokenizer
    import real_vocab
    yield "Qwen2.5/3 (real_vocab)", tokenizer_from_metadata(real_vocab.vocab_metadata("qwen2"))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def one(tok, grammar: Grammar, text: str) -> tuple[float, list[float]]:
    t = time.perf_counter()
    mask = GrammarMask(tok, grammar)
    compile_s = time.perf_counter() - t
    steps = []
    for token in tok.encode(text, add_bos=False):
        t = time.perf_counter()
        allowed = mask.allowed()
        steps.append(time.perf_counter() - t)
        assert allowed[token], f"the grammar refused token {token} of a valid answer"
        mask.accept(token)
    return compile_s, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"llguidance {llg.__version__}")
    print("| vocabulary | tokens | tokenizer build | grammar | compile (median) | mask per token p50 | p99 | steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, tok in vocabularies():
        t = time.perf_counter()
        ll_tokenizer(tok)
        build = time.perf_counter() - t
        cases = [("JSON schema", Grammar("json_schema", llg.LLMatcher.grammar_from_json_schema(
            SCHEMA, defaults=JSON_LAYOUT)), json.dumps(ANSWER, separators=(",", ":"))),
                 ("GBNF", Grammar("grammar", llg.grammar_from("gbnf", GBNF)), GBNF_TEXT)]
        for label, grammar, text in cases:
            compiles, steps = [], []
            for _ in range(args.repeats):
                c, s = one(tok, grammar, text)
                compiles.append(c)
                steps += s
            steps.sort()
            print(f"| {name} | {tok.n_vocab} | {ms(build)} | {label} | {ms(statistics.median(compiles))} | "
                  f"{ms(statistics.median(steps))} | {ms(steps[int(0.99 * (len(steps) - 1))])} | "
                  f"{len(steps) // args.repeats} |")


if __name__ == "__main__":
    main()
