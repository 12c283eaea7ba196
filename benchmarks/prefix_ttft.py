"""Time to first token of a request whose long prompt prefix the server has cached, against the same
request computed cold (`cache_prompt: false`), through `framework serve` on loopback (issue goal: the cached
figure at most 15% of the cold one).

    .venv/bin/python benchmarks/prefix_ttft.py [--model smollm2] [--backends cpu] [--prefix-tokens 1000] [--threads N]

The prompt: the first --prefix-tokens tokens of a license text (/usr/share/common-licenses/Apache-2.0) and a
question that differs per request, so only the prefix can be reused. Turns: cold and cached take turns
--repeats times after one warm-up of each (the first cached request fills the cache); medians printed, with
each answer's usage.prompt_tokens_details.cached_tokens.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import free_port, model_id, start_server  # noqa: E402

LICENSE = Path("/usr/share/common-licenses/Apache-2.0")


def prefix_text(model: str, n_tokens: int) -> str:
    from framework.model.default import MODELS, model_path
    from framework.model.model import Model
    path = model_path(model) if model in MODELS else Path(model)
    tok = Model(path).tokenizer
    ids = tok.encode(LICENSE.read_text(encoding="utf-8"))[:n_tokens]
    return tok.decode(ids)


def first_token(port: int, model: str, prompt: str, cache: bool) -> tuple[float, int]:
    """Seconds to the first streamed token, and the cached prompt tokens the answer reports."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0, "stream": True,
                       "cache_prompt": cache, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, cached = None, -1
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if ttft is None and event.get("choices") and event["choices"][0].get("text"):
            ttft = time.perf_counter() - t0
        if event.get("usage"):
            cached = event["usage"].get("prompt_tokens_details", {}).get("cached_tokens", -1)
    conn.close()
    return ttft if ttft is not None else time.perf_counter() - t0, cached


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backends", default="cpu")
    ap.add_argument("--prefix-tokens", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, help="threads of framework serve (-t; default: its own)")
    args = ap.parse_args()
    args.parallel, args.queue, args.ctx = 1, 4, 2048
    prefix = prefix_text(args.model, args.prefix_tokens)
    port = free_port()
    log = open(Path("/tmp") / f"prefix_ttft_{port}.log", "w")
    server = start_server(args, port, log)
    try:
        name = model_id(args.model)
        ask = lambda i: f"{prefix}\n\nQuestion {i}: what is this text about?"  # noqa: E731
        first_token(port, name, ask(-1), False)            # warm-up of each
        first_token(port, name, ask(-2), True)
        cold, warm, reused = [], [], []
        for i in range(args.repeats):
            cold.append(first_token(port, name, ask(2 * i), False)[0])
            t, c = first_token(port, name, ask(2 * i + 1), True)
            warm.append(t)
            reused.append(c)
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"{args.model} on {args.backends}, a {args.prefix_tokens}-token prefix: time to first token cold "
              f"{c * 1000:.0f} ms, cached {w * 1000:.0f} ms ({w / c:.1%} of cold; medians of {args.repeats}); "
              f"cached tokens reported {reused}")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
