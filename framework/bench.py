"""`framework bench`: load time, prefill and decode speed, bytes per token and the bandwidth they
imply, the machine's own bandwidth measured in the same run, and llama.cpp on the same file,
prompt and threads when llama-cpp-python is installed.

The engines' runs are interleaved (this framework, llama.cpp, this framework, ...), so that a slow
period of a shared host hits both; every figure is printed as min, median and max over --repeats
runs (after one warm-up run each), and a ratio whose two spreads overlap is marked not significant.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console

from . import caches
from .exit_codes import EXIT_OK
from .model.default import resolve_model
from .terminal import Row, err, out, print_table, select_devices
from .terminal.devices import THREADS_REACH

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PARAGRAPH = ("The history of computing is a story of machines that learned to do arithmetic faster and "
             "faster, and of people who found new things to ask of them. Early mechanical calculators "
             "gave way to electronic circuits, and those circuits shrank until millions fit on a chip. ")


@dataclass
class Spread:
    """Repeated measurements of one figure."""

    values: list[float] = field(default_factory=list)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    def cells(self, fmt: str = "{:.1f}") -> list[str]:
        return [fmt.format(v) for v in (self.min, self.median, self.max)]

    def overlaps(self, other: Spread) -> bool:
        return self.min <= other.max and other.min <= self.max


def ratio_cells(a: Spread, b: Spread) -> tuple[list[str], str]:
    """a / b: the lowest, median and highest ratio the runs allow, and whether it is significant (the
    two spreads do not overlap)."""
    cells = [f"{a.min / b.max:.2f}x", f"{a.median / b.median:.2f}x", f"{a.max / b.min:.2f}x"]
    return cells, ("not significant (spreads overlap)" if a.overlaps(b) else "significant")


def interleave(engines: dict[str, Callable[[], dict[str, float]]], repeats: int) -> dict[str, dict[str, Spread]]:
    """Run every engine once to warm up, then ``repeats`` rounds of one run each, in turn; returns
    engine -> figure -> Spread of the counted rounds."""
    results: dict[str, dict[str, Spread]] = {name: {} for name in engines}
    for round_no in range(repeats + 1):
        for name, run in engines.items():
            figures = run()
            if round_no == 0:
                continue                 # the warm-up round: caches, page faults, lazy compiles
            for key, value in figures.items():
                results[name].setdefault(key, Spread()).values.append(value)
    return results


def prompt_ids(tokenizer, n: int) -> list[int]:
    ids = tokenizer.encode(PARAGRAPH * (n // 20 + 2))
    return ids[:n]


def measure_bandwidth(mib: int = 1024, repeats: int = 5) -> dict[str, Spread]:
    """Memory bandwidth two ways: a copy (read + write) and a float32 matrix-vector product (read)."""
    a = np.ones(mib * 2**20 // 4, dtype=np.float32)
    b = np.empty_like(a)
    w = a.reshape(-1, 1024)
    x = np.ones(1024, dtype=np.float32)
    copy = _times(lambda: np.copyto(b, a), repeats)
    gemv = _times(lambda: w @ x, repeats)
    return {"copy_GBps": Spread([2 * a.nbytes / t / 1e9 for t in copy]),
            "gemv_GBps": Spread([a.nbytes / t / 1e9 for t in gemv])}


def _times(fn, repeats: int) -> list[float]:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def decode_weight_bytes(session) -> int:
    """Bytes of weights one decode step reads: every weight a MUL_MAT streams (a GET_ROWS reads one row)."""
    plan = next(p for p, _ in session.plans.values() if p.graph.meta.get("phase") == "decode")
    total = 0
    for frag in plan.fragments:
        seen = set()
        for n in frag.nodes:
            w = n.src[0] if n.op == "MUL_MAT" else None
            if w is not None and w.is_leaf and id(w) not in seen:
                seen.add(id(w))
                handle = session.executor.weights[(frag.device, id(w))]
                total += int(getattr(handle, "nbytes", w.nbytes))
    return total


class FrameworkEngine:
    """This framework on the selected devices: loaded, planned and compiled once; run() times a
    prefill of the prompt and n_decode greedy decode steps."""

    def __init__(self, path: Path, devices, n_prompt: int, n_decode: int, check_values: bool = False):
        from .model.model import Model
        from .runtime.session import Session
        t0 = time.perf_counter()
        self.model = Model(path)
        self.session = Session(self.model, devices, n_ctx=max(512, n_prompt + n_decode + 8),
                               check_values=check_values)
        self.ids = prompt_ids(self.model.tokenizer, n_prompt)
        self.session.plan(len(self.ids), 0, greedy=True)     # the shapes run()'s greedy steps take
        self.session.plan(1, len(self.ids), greedy=True)
        self.load_s = time.perf_counter() - t0
        self.n_decode = n_decode
        self.bytes_per_token = decode_weight_bytes(self.session)

    def run(self) -> dict[str, float]:
        s = self.session
        s.reset()
        t = caches.Stopwatch()              # a kernel compile the warm-up round missed is not counted
        from .runtime.greedy import greedy_tokens
        tokens = greedy_tokens(s, self.ids, self.n_decode + 1)    # the argmax where the logits are made
        next(tokens)
        prefill = len(self.ids) / t.seconds
        t = caches.Stopwatch()
        for _ in tokens:
            pass
        return {"prefill": prefill, "decode": self.n_decode / t.seconds}


class ParallelEngine:
    """n sequences of the same prompt stepped together (runtime/batch.py): run() times n_decode batched
    decode steps of n rows each, after the prompts' prefill; the figure is the tokens of all n a second."""

    def __init__(self, fw: FrameworkEngine, n: int):
        from .runtime.batch import Batch
        from .runtime.session import Session
        s = fw.session
        self.session = Session(fw.model, s.devices, n_ctx=n * s.n_ctx, share_model_with=s)
        self.batch, self.ids, self.n, self.n_decode = Batch(self.session), fw.ids, n, fw.n_decode

    def run(self) -> dict[str, float]:
        from .runtime.batch import Part
        b = self.batch
        for seq in range(self.n):
            b.free(seq)
        last = [b.step([Part(seq, self.ids)])[0] for seq in range(self.n)]
        t = caches.Stopwatch()
        for _ in range(self.n_decode):
            last = b.step([Part(seq, [int(np.argmax(x))]) for seq, x in enumerate(last)])
        return {"decode": self.n * self.n_decode / t.seconds}


class LlamaCppEngine:
    """llama.cpp (llama-cpp-python) on the same file, prompt tokens and threads."""

    def __init__(self, path: Path, ids: list[int], n_decode: int, threads: int):
        from llama_cpp import Llama
        self.llm = Llama(str(path), n_ctx=max(512, len(ids) + n_decode + 8), n_batch=512, n_threads=threads,
                         n_threads_batch=threads, verbose=False)
        self.ids, self.n_decode = ids, n_decode

    def run(self) -> dict[str, float]:
        llm = self.llm
        llm.reset()
        t = time.perf_counter()
        llm.eval(self.ids)
        prefill = len(self.ids) / (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(self.n_decode):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        return {"prefill": prefill, "decode": self.n_decode / (time.perf_counter() - t)}

    def close(self) -> None:
        self.llm.close()


def transparent_huge_pages() -> str:
    """The kernel's transparent huge page mode (always, madvise or never): with 4 KiB pages a decode step that
    streams a gigabyte of weights pays a TLB miss every page, so the mode moves the engines' figures."""
    try:
        text = THP.read_text()
    except OSError as e:
        return f"unknown ({e.strerror or e})"
    chosen = [w.strip("[]") for w in text.split() if w.startswith("[")]
    return chosen[0] if chosen else text.strip()


def llama_cpp_installed() -> bool:
    from importlib.util import find_spec
    return find_spec("llama_cpp") is not None


def bench_reservation(path, devices, n_prompt: int, repeats: int = 5) -> list[tuple]:
    """Milliseconds to build and to reserve (plan and check) the prefill and decode graphs."""
    from .core.scheduler import reserve
    from .model.model import Model
    from .runtime.session import Session
    model = Model(path)
    rows = []
    for phase, n_tokens, n_past in (("prefill", n_prompt, 0), ("decode", 1, n_prompt)):
        session = Session(model, devices, n_ctx=max(512, n_prompt + 8))
        key = session.context.shape_key(n_tokens, n_past, 1)
        build, plan = Spread(), Spread()
        for _ in range(repeats):
            session.context.graphs.clear()
            t0 = time.perf_counter()
            graph, _ = session.context.graph(key)
            t1 = time.perf_counter()
            reserve({phase: graph}, devices, session.residence)
            plan.values.append((time.perf_counter() - t1) * 1e3)
            build.values.append((t1 - t0) * 1e3)
        rows.append((phase, len(graph.nodes), build, plan))
    return rows


def _models(spec: str) -> list[tuple[str, Path]]:
    """-m: packaged model names or GGUF files, comma-separated."""
    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise ValueError("-m is empty: name packaged models (smollm2, gemma3) or GGUF files")
    return [(Path(n).name if Path(n).suffix == ".gguf" else n, resolve_model(n)) for n in names]


def run_bench(args) -> int:
    models = _models(args.model)
    # the cpu plugin's kernels and OpenVINO's CPU device take the same thread count as llama.cpp
    devices = select_devices(args.backends, threads=args.threads)
    err.print(f"threads: {args.threads} ({THREADS_REACH}, and llama.cpp), "
              f"{os.cpu_count()} CPUs; prompt "
              f"{args.prompt_tokens} tokens, {args.decode_tokens} decoded; min, median and max of {args.repeats} "
              f"runs after a warm-up, the engines taking turns", soft_wrap=True)
    # llama.cpp's decode of a 1.5B model ran 1.29x faster with "always" than with "madvise" (docs/benchmarks.md)
    err.print(f"transparent huge pages: {transparent_huge_pages()} ({THP})", soft_wrap=True, markup=False)
    for d in devices:       # the settings that change a device's arithmetic and speed (its precision, its threads)
        err.print(f"device {d.name}: {d.description or 'no description'}", soft_wrap=True, markup=False)
    rows = []
    for name, path in models:
        for phase, nodes, build, plan in bench_reservation(path, devices, args.prompt_tokens):
            rows.append(Row([name, phase, str(nodes), " / ".join(build.cells()), " / ".join(plan.cells())]))
    print_table(Console(highlight=False), ["model", "graph", "nodes", "build ms (min/med/max)",
                                                 "reserve ms (min/med/max)"], rows, right=(2, 3, 4),
                title="reservation: build the graph, then plan and check it")
    if args.reservation_only:
        return EXIT_OK
    bw = measure_bandwidth()
    with_llama = not args.no_llama_cpp and llama_cpp_installed()
    if not args.no_llama_cpp and not with_llama:
        out("llama.cpp: not installed (make bench builds it: benchmarks/install_llama_cpp.sh)\n")
    for name, path in models:
        _bench_model(name, path, devices, args, bw, with_llama)
    out(f"machine bandwidth (same run, min/median/max): copy {' / '.join(bw['copy_GBps'].cells())} GB/s "
        f"(read + write), float32 gemv {' / '.join(bw['gemv_GBps'].cells())} GB/s (read)\n")
    return EXIT_OK


def _greedy_how(fw: FrameworkEngine) -> str:
    """How the timed greedy decode took its tokens (runtime/greedy.py), where not from logits read back."""
    from .runtime.greedy import pipelined
    if pipelined(fw.session):
        return "greedy steps: ARGMAX on the device, each queued before the step before's token is read"
    return "greedy steps: ARGMAX on the device, one index read back a step" if fw.session.argmax_on_device else ""


def _bench_model(name: str, path: Path, devices, args, bw: dict[str, Spread], with_llama: bool) -> None:
    fw = FrameworkEngine(path, devices, args.prompt_tokens, args.decode_tokens, args.check_values)
    for d in devices:                       # what a plugin reports: compiled models, cache hits
        line = d.report_line()
        if line:
            out(line + "\n")
    engines: dict[str, Callable[[], dict[str, float]]] = {"framework": fw.run}
    if args.parallel > 1:
        engines["parallel"] = ParallelEngine(fw, args.parallel).run
    ref = LlamaCppEngine(path, fw.ids, args.decode_tokens, args.threads) if with_llama else None
    if ref is not None:
        engines["llama.cpp"] = ref.run
    try:
        got = interleave(engines, args.repeats)
    finally:
        if ref is not None:
            ref.close()
    ours = got["framework"]
    eff = Spread([fw.bytes_per_token * v / 1e9 for v in ours["decode"].values])
    rows = [Row(["prefill tok/s", *ours["prefill"].cells()]),
            Row(["decode tok/s", *ours["decode"].cells()], _greedy_how(fw)),
            Row(["effective GB/s", *eff.cells()], f"{fw.bytes_per_token / 1e6:.0f} MB of weights per decoded token; "
                f"{eff.median / bw['gemv_GBps'].median:.0%} of the median gemv bandwidth")]
    if args.parallel > 1:
        many = got["parallel"]["decode"]
        cells, verdict = ratio_cells(many, ours["decode"])
        rows += [Row([f"decode tok/s, {args.parallel} sequences", *many.cells()],
                     f"all {args.parallel} together, each step batching their decode rows"),
                 Row(["parallel / one", *cells], verdict, "" if verdict == "significant" else "yellow")]
    if ref is not None:
        theirs = got["llama.cpp"]
        for phase in ("prefill", "decode"):
            rows.append(Row([f"llama.cpp {phase} tok/s", *theirs[phase].cells()]))
        for phase in ("prefill", "decode"):
            cells, verdict = ratio_cells(ours[phase], theirs[phase])
            rows.append(Row([f"{phase} ratio", *cells], verdict, "" if verdict == "significant" else "yellow"))
    title = (f"{name} on {', '.join(d.name for d in devices)}: loaded, planned and compiled in {fw.load_s:.1f} s")
    print_table(Console(highlight=False), ["figure", "min", "median", "max"], rows, right=(1, 2, 3),
                title=title)
