"""What reserving a new step shape costs a server's batched session: `framework serve --parallel P --ctx C`'s
session (runtime/session.py, its shapes from serve/models.py's batched_shapes) reserves them at its start, then
meets new prompt lengths one after another (steps of P decode rows and a prompt chunk of 9, 10, ... tokens,
each a shape of its own), as a server with requests of distinct prompts does; each is planned and checked with
every shape kept. Prints the start's reservation and the mean time of the first and the last ten new shapes:

    python benchmarks/reserve_new_shape.py [-m gemma3] [--parallel 8] [--ctx 512] [--shapes 80]"""

from __future__ import annotations

import argparse
import time

from framework.model.default import resolve_model
from framework.model.model import Model
from framework.registry import default_registry
from framework.runtime.session import Session
from framework.serve.models import batched_shapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="gemma3", help="a packaged model's name or a GGUF file")
    ap.add_argument("--backends", default="cpu")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=512, help="context a request (the cache holds --parallel of them)")
    ap.add_argument("--shapes", type=int, default=80, help="new prompt lengths met after the start")
    args = ap.parse_args()
    model = Model(resolve_model(args.model))
    s = Session(model, default_registry().select(args.backends), n_ctx=args.ctx * args.parallel, n_batch=args.ctx,
                out_rows=args.parallel)
    keys = batched_shapes(s, args.parallel)
    t0 = time.perf_counter()
    s.reserve_shapes(keys)
    print(f"{args.model} on {args.backends}, --parallel {args.parallel} --ctx {args.ctx}: the start reserves "
          f"{len(keys)} shapes in {time.perf_counter() - t0:.2f} s")
    s.max_plans = len(keys) + 48          # as serve keeps them
    times = []
    for n in range(args.parallel + 1, args.parallel + 1 + args.shapes):
        key = s.context.rows_key(n, args.ctx, args.parallel)
        t0 = time.perf_counter()
        s.reserve_shapes([key])
        times.append(time.perf_counter() - t0)
    first, last = times[:10], times[-10:]
    print(f"a new shape: the first ten {1e3 * sum(first) / len(first):.1f} ms each, the last ten "
          f"{1e3 * sum(last) / len(last):.1f} ms each, {len(s.plans)} shapes kept")


if __name__ == "__main__":
    main()
