"""Argument parsing and the commands: run, check, split, serve, backends, models, settings, cache, info,
perplexity, bench, conformance."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from rich.markup import escape

from ..exit_codes import EXIT_BROKEN_PIPE, EXIT_CAPABILITY, EXIT_DEVICE, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED
from ..terminal import Row, err, out, print_table, print_wrapped, select_devices, start_output
from ..terminal.devices import THREADS_REACH
from .common import (
    Terminated,
    UsageError,
    check_output,
    device_memory,
    fail,
    load_model,
    memory_caps,
    on_sigterm,
    port_number,
    positive_int,
    seconds,
    show_traceback,
    text_argument,
    weight_progress,
    whole_number,
    write_output,
)
from .draft import add_draft_args, add_serve_draft_args, draft_line, draft_record, speculative_decoder
from .verify import add_verify_args, verified_line, verifier_for

SAMPLE_PROMPT = "The capital of France is"
# the caches `framework cache` lists, for its help without loading every plugin (a test keeps it whole)
CACHES = (("gguf-index", "parsed GGUF headers"), ("numba", "the cpu plugin's compiled kernels"),
          ("opencl", "OpenCL kernel binaries"), ("cuda", "CUDA kernel modules (CuPy's)"),
          ("openvino", "OpenVINO compiled models"), ("xdna", "XDNA packed weight tiles"))


def build_parser() -> argparse.ArgumentParser:
    from .. import settings
    p = argparse.ArgumentParser(prog="framework", description="Run GGUF language models across CPUs, GPUs "
                                "and NPUs through backend plugins.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="generate text from a prompt")
    run.add_argument("prompt", nargs="?", help=f"the text to continue (default: {SAMPLE_PROMPT!r}; with -cnv, the "
                     f"system prompt, default none)")
    run.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE, UTF-8 text, one trailing newline "
                     "dropped as llama.cpp does (default: the prompt argument)")
    run.add_argument("-cnv", "--conversation", "--interactive", dest="conversation", action="store_true",
                     help="chat: read a message a line from stdin, answer each in the model's chat template with the "
                     "conversation so far (-n tokens a reply; /clear forgets it, /exit or end of input ends)")
    _model_args(run)
    _threads_arg(run)
    run.add_argument("-n", "--n-predict", type=positive_int, default=64, help="tokens to generate (default 64)")
    run.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy (default)")
    run.add_argument("--top-k", type=int, default=40, help="sample among the K likeliest tokens (default 40)")
    run.add_argument("--top-p", type=float, default=0.95, help="sample among the likeliest tokens whose "
                     "probabilities add up to P (default 0.95)")
    run.add_argument("--seed", type=int, default=None, help="the sampler's seed, 0 or more (default: a random seed "
                     "each run)")
    run.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    run.add_argument("--plan", metavar="FILE", help="write the plans that ran as JSON")
    run.add_argument("--plan-view", metavar="FILE", help="write the view of the plans that ran, with the time each "
                     "fragment took (.html, .svg, .dot, .json or .txt)")
    add_draft_args(run)
    _check_values_arg(run)
    add_verify_args(run)

    check = sub.add_parser("check", help="reserve (plan and check every graph shape) without running")
    _model_args(check)
    check.add_argument("--prompt-tokens", type=positive_int, default=32, help="prompt length to plan for (default 32)")
    check.add_argument("-n", "--n-predict", type=positive_int, default=64, help="tokens to generate (default 64)")
    check.add_argument("--plan", metavar="FILE", help="write the reserved plans as JSON")
    add_draft_args(check)
    add_verify_args(check)

    split = sub.add_parser("split", help="show where every node of the plan runs, why, and what it costs")
    _model_args(split)
    split.add_argument("--phase", choices=("prefill", "decode"), help="only this phase's plans (default: all)")
    split.add_argument("--prompt-tokens", type=positive_int, default=32, help="prompt length to plan for (default 32)")
    split.add_argument("-n", "--n-predict", type=positive_int, default=64, help="tokens to generate (default 64)")
    split.add_argument("-o", "--output", metavar="FILE", help=".html, .svg, .dot, .json or .txt (default: the "
                       "summary on the terminal)")
    add_draft_args(split)

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)")
    serve.add_argument("-m", "--model", action="append", metavar="MODEL", help="a GGUF file or a short name ("
                       "smollm2, gemma3); repeat to serve several (default: gemma3)")
    _device_args(serve)
    _threads_arg(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this "
                       "machine only)")
    serve.add_argument("--port", type=port_number, default=8080, help="TCP port, 0 for any free one (default 8080)")
    serve.add_argument("--parallel", type=positive_int, default=1, help="requests per model generating at once, "
                       "their decode rows batched in one step over one KV cache of --ctx tokens each (default 1)")
    serve.add_argument("--queue", type=whole_number, default=16, help="requests per model that may wait for a session; "
                       "more are refused with 429 (default 16)")
    serve.add_argument("--api-key", default=settings.read(settings.API_KEY.name), help="require 'Authorization: "
                       "Bearer KEY' (default: $FRAMEWORK_API_KEY, else no key)")
    serve.add_argument("--max-body", type=positive_int, default=1 << 20, help="largest request body in bytes (default "
                       "1048576: 1 MiB)")
    serve.add_argument("--shutdown-timeout", type=seconds, default=10.0, help="seconds running requests get to "
                       "finish after SIGINT/SIGTERM before they are cancelled (default 10)")
    serve.add_argument("--cors", action="append", metavar="ORIGIN", help="let web pages of ORIGIN (e.g. "
                       "http://localhost:3000) call the server: repeat it or give a comma list, '*' for any (default: "
                       "none; other cross-origin requests are refused with 403)")
    serve.add_argument("--embeddings", action="store_true", help="answer POST /v1/embeddings (pooled hidden "
                       "states), with one more session of --ctx tokens per model (default: off, the route refuses)")
    add_verify_args(serve, every=16)
    add_serve_draft_args(serve)

    backends = sub.add_parser("backends", help="list every plugin and device, and why a device is unavailable")
    _ray_address(backends)
    sub.add_parser("models", help="the packaged models -m accepts by name, with their files and sizes")
    sub.add_parser("settings", help="every environment setting, what it accepts, and its effective value")
    cache = sub.add_parser("cache", help="the on-disk caches and their sizes; `cache clear` deletes them",
                           description="The caches under FRAMEWORK_CACHE (default ~/.cache/framework): "
                           + "; ".join(f"{n}: {what}" for n, what in CACHES) + ".")
    cache.add_argument("action", nargs="?", choices=("show", "clear"), default="show", help="show the caches, or "
                       "clear them (default: show)")
    cache.add_argument("names", nargs="*", metavar="NAME",
                       help=f"only these caches ({', '.join(n for n, _ in CACHES)}; default: all)")

    info = sub.add_parser("info", help="architecture, sizes, tensor types and tokenizer of a model file")
    _model_option(info)

    ppl = sub.add_parser("perplexity", help="perplexity of a text file")
    _model_args(ppl)
    _threads_arg(ppl)
    ppl.add_argument("-f", "--file", required=True, help="text file")
    _check_values_arg(ppl)

    bench = sub.add_parser("bench", help="load, prefill and decode speed, bandwidth, llama.cpp alongside")
    bench.add_argument("-m", "--model", "--models", dest="model", default="smollm2,gemma3", metavar="MODEL",
                       help="comma-separated packaged model names or GGUF files (default: smollm2,gemma3)")
    bench.add_argument("--backends", default="cpu", help="priority list of devices or aliases (default: cpu)")
    _ray_address(bench)
    bench.add_argument("--prompt-tokens", type=positive_int, default=256, help="prompt tokens a prefill runs "
                       "(default 256)")
    bench.add_argument("--decode-tokens", type=positive_int, default=32, help="decode steps a run times (default 32)")
    bench.add_argument("--repeats", type=positive_int, default=3, help="counted runs of each engine, after one "
                       "warm-up run (default 3)")
    bench.add_argument("-t", "--threads", type=positive_int, default=2, help=f"threads of {THREADS_REACH} and of "
                       f"llama.cpp (default 2)")
    bench.add_argument("--parallel", type=positive_int, default=1, help="also time N sequences decoding together "
                       "in batched steps (aggregate decode tok/s; default 1: not timed)")
    bench.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even when installed")
    bench.add_argument("--reservation-only", action="store_true", help="only time graph building and reservation")
    _check_values_arg(bench)

    conf = sub.add_parser("conformance", help="the op conformance suite (pytest, with this interpreter) for a device",
                          description="Runs `python -m pytest --pyargs framework.conformance --device NAME` with "
                          "the interpreter framework is installed in, on every available device without --device; "
                          "every other argument goes to pytest (-x, -q, -k MUL_MAT, ...).")
    conf.add_argument("--device", action="append", metavar="NAME",
                      help="device to test, as `framework backends` lists it (repeat for several; default: every "
                      "available device)")
    for sp in sub.choices.values():
        sp.add_argument("--debug", action="store_true", help="on an error, show the traceback (file and line) too")
    return p


def _check_values_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check-values", action="store_true", help="check that every device's outputs are finite at "
                   "every fragment boundary (always on for plugins outside framework's own distribution)")


def _model_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", metavar="MODEL", help="GGUF file or packaged model name (smollm2, gemma3; "
                   "`framework models` lists them); default: gemma3")


def _model_args(p: argparse.ArgumentParser) -> None:
    _model_option(p)
    _device_args(p)


def _threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--threads", type=positive_int, help=f"threads of {THREADS_REACH}, as `framework bench "
                   f"--threads` sets them (default: each keeps its own: numba's NUMBA_NUM_THREADS, "
                   f"FRAMEWORK_OPENVINO_THREADS)")


def _ray_address(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray-address", metavar="HOST:PORT", help="a Ray cluster whose nodes lend their devices, listed as "
                   "ray:NODE/DEVICE (sets RAY_ADDRESS; needs framework[ray]; docs/distributed.md)")


def _device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backends", default="cpu", help="priority list of devices or aliases: cpu, gpu, npu (default: "
                   "cpu)")
    _ray_address(p)
    p.add_argument("--device-profile", metavar="NAME", help="emulate the hardware NAME (npu37xx, npu40xx on openvino "
                   "devices; xdna, xdna2 on xdna:0's host arm): planning and execution under its limits, labelled "
                   "EMULATION in every report")
    p.add_argument("--strict", action="store_true", help="fail instead of falling back to a later device")
    p.add_argument("--kv-device", help="device that holds the KV cache (default: each layer's with the layer, on "
                   "the first device that can write it)")
    p.add_argument("--device-memory", action="append", type=device_memory, metavar="DEVICE=SIZE",
                   help="plan as if DEVICE had SIZE of memory (200M, 1.5G; repeatable): the layers that do not fit go "
                   "to the next device in --backends")
    p.add_argument("--ctx", type=positive_int, default=2048, help="context length in tokens (default 2048)")
    p.add_argument("--batch", type=positive_int, default=512, help="prefill chunk in tokens (default 512)")


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra and args.command != "conformance":      # conformance hands what it does not know to pytest
            files = [a for a in extra if a.endswith(".gguf")]
            if files:
                parser.error(f"unrecognized arguments: {' '.join(extra)} (a model is named with -m: -m {files[0]})")
            parser.parse_args(argv)                       # the usual usage error, exit status 2
        args.pytest_args = extra
        if getattr(args, "ray_address", None):     # read by the ray plugin, as Ray itself reads it
            os.environ["RAY_ADDRESS"] = args.ray_address
        start_output()
        from ..core.scheduler.errors import CapabilityError, DeviceRunError, DeviceSelectionError
        from ..model.chat import ChatTemplateError
        from ..model.gguf_file import ModelFileError
        from ..runtime.context import ContextFullError
    except KeyboardInterrupt:
        return fail("interrupted (Ctrl-C)", EXIT_INTERRUPTED)
    codes = ((CapabilityError, EXIT_CAPABILITY), (DeviceRunError, EXIT_DEVICE),
             ((ModelFileError, DeviceSelectionError, ContextFullError, ChatTemplateError, FileNotFoundError,
               ValueError, UsageError), EXIT_INPUT))
    # SIGTERM stops the command where it is, as Ctrl-C does (only the main thread may set a handler)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
    try:
        return COMMANDS[args.command](args)
    except (CapabilityError, DeviceRunError, ValueError, FileNotFoundError, UsageError) as e:
        code = next(c for kind, c in codes if isinstance(e, kind))
        if args.debug:
            show_traceback(e)
        hint = "" if args.debug or code != EXIT_DEVICE else "\n  (--debug shows the traceback, with file and line)"
        return fail(str(e) + hint, code)
    except BrokenPipeError:             # `framework run ... | head`: the reader left; say nothing more
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        return fail(f"{where}{e.strerror or e}", EXIT_INPUT)
    except KeyboardInterrupt:
        return fail("interrupted (Ctrl-C)", EXIT_INTERRUPTED)
    except Terminated:
        return fail("terminated (SIGTERM)", EXIT_TERMINATED)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def cmd_run(args) -> int:
    from ..runtime.generate import generate
    from ..runtime.sampling import Sampler, SamplingParams
    from ..runtime.session import Session

    sampler = Sampler(SamplingParams(args.temp, args.top_k, args.top_p, args.seed))
    check_output(args.plan, "--plan")
    check_output(args.plan_view, "--plan-view")
    args.prompt = _prompt_text(args)
    if args.conversation and (args.draft or args.chat):
        raise UsageError(f"-cnv answers in the chat template by itself, and without a draft: drop "
                         f"{'--draft' if args.draft else '--chat'}")
    devices = _devices(args)
    model = load_model(args.model)
    tok = model.tokenizer
    # a conversation's first message is not known yet: plan for a full prefill chunk
    ids = ([0] * max(1, min(args.batch, args.ctx - args.n_predict)) if args.conversation
           else _prompt_ids(model, args.prompt, args.chat))
    if not ids:
        return fail(f"the prompt is empty and {model.file.path.name} adds no beginning-of-sequence token, so there "
                    f"is nothing to continue: give a prompt")
    session = Session(model, devices, n_ctx=args.ctx, n_batch=args.batch, strict=args.strict,
                      kv_device=args.kv_device, memory_caps=memory_caps(args.device_memory),
                      check_values=args.check_values, verifier=verifier_for(args, model))
    decoder = speculative_decoder(args, session, devices)
    greedy = sampler.greedy          # generate()'s steps give the argmax (runtime/greedy.py)
    if decoder is not None:
        decoder.reserve(len(ids), args.n_predict, greedy)
    else:
        session.reserve(len(ids), args.n_predict, greedy=greedy)     # every check before anything is loaded
    with weight_progress() as progress:
        if decoder is not None:
            decoder.prepare(progress)                  # every reserved plan of target and draft
        else:
            session.progress = progress
            session.plan(min(len(ids), args.batch), 0, greedy=greedy and len(ids) <= args.batch)   # load, compile
            if args.n_predict > 1:
                session.plan(1, len(ids), greedy=greedy)   # the decode step's program too
    session.progress = None
    if args.conversation:
        from .chat import converse
        generated, interrupted = converse(session, args, sampler)
        return _report_run(args, model, session, generated, interrupted, decoder)
    out(args.prompt if not args.chat else "")
    interrupted, generated = False, 0
    stream = (decoder.generate(ids, args.n_predict, sampler, tok.eog_ids) if decoder is not None else
              generate(session, ids, args.n_predict, sampler, tok.eog_ids))
    try:
        for piece in stream:
            out(piece.text)
            generated += 1
    except KeyboardInterrupt:
        interrupted = True
    out("\n")
    return _report_run(args, model, session, generated, interrupted, decoder)


def _report_run(args, model, session, generated: int, interrupted: bool, decoder) -> int:
    """After the text: the summary, fallbacks, memory fit and placement on stderr, then the files asked for."""
    from .report import fallback_lines, memory_fit_lines, placement_rows
    _summary(model, session, generated, interrupted, decoder)
    if session.executor.verifier is not None:
        err.print(escape(verified_line(session.executor.verifier)), soft_wrap=True)
    for line in [line for s in (decoder.sessions() if decoder else [session]) for line in fallback_lines(s)]:
        err.print(f"[yellow]{escape(line)}[/yellow]", soft_wrap=True)
    for line in memory_fit_lines(session):
        err.print(escape(line), soft_wrap=True)
    print_table(err, *placement_rows(session), right=(1, 2, 3, 4, 5, 6), title="placement")
    if decoder is not None and decoder.draft.session is not None:
        print_table(err, *placement_rows(decoder.draft.session), right=(1, 2, 3, 4, 5, 6), title="draft placement")
    if args.plan:
        _write_plans(session, Path(args.plan), decoder)
    if args.plan_view:
        from .split import write_run_view
        write_run_view(session, Path(args.plan_view), decoder)
    return EXIT_INTERRUPTED if interrupted else 0


def _prompt_text(args) -> str | None:
    """The prompt: the argument, or -f FILE's text (one trailing newline dropped, as llama.cpp does), or the
    sample prompt; with -cnv, the system prompt (none by default)."""
    if args.file is not None and args.prompt is not None:
        raise UsageError(f"a prompt argument and -f {args.file} both give the prompt: give one")
    if args.file is None:
        default = None if args.conversation else SAMPLE_PROMPT
        return default if args.prompt is None else text_argument(args.prompt)
    path = Path(args.file)
    if path.is_dir():
        raise UsageError(f"-f {args.file}: that is a folder; name a text file")
    raw = path.read_bytes()                 # a missing file is an OSError, named by main()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"-f {args.file} is not UTF-8 text: byte 0x{raw[e.start]:02x} at byte offset {e.start} "
                         f"({e.reason})") from None
    return text[:-1] if text.endswith("\n") else text


def _prompt_ids(model, prompt: str, chat: bool) -> list[int]:
    if not chat:
        return model.tokenizer.encode(prompt)
    from ..model.chat import chat_prompt_ids
    from .chat import chat_template
    return chat_prompt_ids(model.tokenizer, chat_template(model, "--chat"), [{"role": "user", "content": prompt}])


def _tokens(n: int) -> str:
    return f"{n} token" + ("" if n == 1 else "s")


def _speed(stats) -> str:
    return f" at {stats.tokens_per_second:.1f} tok/s" if stats.tokens else ""


def _summary(model, session, generated: int, interrupted: bool, decoder=None) -> None:
    names = ", ".join(d.name + (f" (EMULATION of {d.emulation})" if d.emulation else "") for d in session.devices)
    pre, dec = session.prefill, session.decode
    err.print(f"model {model.name} ({model.arch.name}, {model.file.path.name}) on {names}"
              + (" - interrupted" if interrupted else ""), soft_wrap=True)
    if decoder is not None:
        st = decoder.stats
        err.print(escape(draft_line(decoder)), soft_wrap=True)
        err.print(f"prefill {_tokens(st.prompt_tokens)} at {st.prompt_tokens / max(st.prompt_seconds, 1e-9):.1f} "
                  f"tok/s; {_tokens(generated)} generated (the first from the prefill)", soft_wrap=True)
        err.print(escape(st.line()), soft_wrap=True)
    else:
        err.print(f"prefill {_tokens(pre.tokens)}{_speed(pre)}, decode {_tokens(dec.tokens)}{_speed(dec)}; "
                  f"{_tokens(generated)} generated (the first from the prefill)",
                  soft_wrap=True)
    compiled = pre.compile_seconds + dec.compile_seconds
    if compiled:                # a first run's kernel compiles, which a cache keeps (caches.filling)
        err.print(f"compiling kernels {compiled:.1f} s, left out of the speeds above", soft_wrap=True)
    for d in session.devices:                 # what a plugin reports: compiled models, cache hits
        line = d.report_line() if session.executor.stats.get(d.name, {}).get("compiles") else None
        if line:
            err.print(escape(line), soft_wrap=True)


def _devices(args):
    """--backends, under --device-profile (an emulation) when given."""
    return select_devices(args.backends, getattr(args, "device_profile", None), getattr(args, "threads", None))


def _write_plans(session, path: Path, decoder=None) -> None:
    from ..runtime.context import phase_name
    record = {"model": str(session.model.file.path), "devices": [d.name for d in session.devices],
              "plans": {phase_name(k): plan.to_dict() for k, (plan, _) in session.plans.items()}}
    tokens = session.prefill.tokens + session.decode.tokens
    if tokens:              # what the summary printed: tokens per second of each phase, each device's time
        record["speed"] = {phase: {"tokens": st.tokens, "seconds": st.seconds,
                                   "tokens_per_second": st.tokens_per_second}
                           for phase, st in (("prefill", session.prefill), ("decode", session.decode))}
        stats = session.executor.stats
        record["device_times"] = {d.name: {"seconds": stats[d.name]["seconds"], "runs": stats[d.name]["runs"],
                                           "bytes_copied": stats[d.name]["bytes_copied"],
                                           "programs": stats[d.name]["compiles"]}
                                  for d in session.devices if d.name in stats}
    figures = {d.name: {**f, "tokens": tokens} for d in session.devices if (f := d.run_figures())}
    if figures:             # what devices measured themselves (a remote device: network bytes, time on its node)
        record["device_figures"] = figures
    if decoder is not None:
        record["draft"] = draft_record(decoder)
    write_output(path, json.dumps(record, indent=1))
    err.print(f"plans written to {path}")


def cmd_check(args) -> int:
    from ..runtime.session import Session
    check_output(args.plan, "--plan")
    devices = _devices(args)
    model = load_model(args.model)
    t0 = time.perf_counter()
    verifier = verifier_for(args, model)
    session = Session(model, devices, n_ctx=args.ctx, n_batch=args.batch, strict=args.strict,
                      kv_device=args.kv_device, memory_caps=memory_caps(args.device_memory), verifier=verifier)
    decoder = speculative_decoder(args, session, devices)
    reservation = (decoder or session).reserve(args.prompt_tokens, args.n_predict)
    seconds = time.perf_counter() - t0
    names = ", ".join(d.name + (f" (EMULATION of {d.emulation})" if d.emulation else "") for d in devices)
    out(f"reservation of {model.name} on {names}: {len(reservation.plans)} graph shapes planned and checked in "
        f"{seconds * 1000:.0f} ms; nothing was loaded or compiled\n")
    if decoder is not None:
        out(draft_line(decoder) + "\n")
    out("\n".join(reservation.summary()) + "\n")
    if args.plan:
        _write_plans(session, Path(args.plan), decoder)
    if verifier is not None:
        _check_verified(model, session, args.prompt_tokens)
    return 0


def _check_verified(model, session, prompt_tokens: int) -> None:
    """check --verify: the reserved prefill and one decode step run on the sample prompt's tokens (repeated to
    --prompt-tokens), each fragment compared with the reference's."""
    from ..runtime.generate import generate
    from ..runtime.sampling import Sampler, SamplingParams
    sample = model.tokenizer.encode(SAMPLE_PROMPT)
    ids = (sample * (prompt_tokens // len(sample) + 1))[:prompt_tokens]
    for _ in generate(session, ids, 2, Sampler(SamplingParams(0.0, 40, 0.95, None)), set()):
        pass
    out(f"--verify: the prefill of {len(ids)} tokens (the sample prompt's, repeated) and one decode step ran; "
        + verified_line(session.executor.verifier) + "\n")


def cmd_serve(args) -> int:
    from ..serve.server import serve
    if args.queue < 0 or not 0 <= args.port <= 65535:
        return fail(f"--queue must be 0 or more and --port between 0 and 65535 (got {args.queue}, {args.port})")
    return serve(args if args.model else argparse.Namespace(**{**vars(args), "model": ["gemma3"]}),
                 _devices(args), memory_caps(args.device_memory), say=lambda line: err.print(escape(line),
                                                                                            soft_wrap=True))


def cmd_split(args) -> int:
    from .split import run_split
    return run_split(args)


def cmd_backends(args) -> int:
    from rich.console import Console

    from ..registry import default_registry
    reg = default_registry()
    if not reg.plugins:
        return fail("no backend plugins found in entry-point group framework.backends (is the package installed?)")
    rows = []
    for rec in reg.plugins.values():
        if rec.error:
            rows.append(Row([rec.name, "-", rec.name, "-", "plugin failed"], rec.error, "red"))
        for d in rec.devices:
            state = "available" if d.available else "unavailable"
            rows.append(Row([d.name, d.type.value, rec.name, d.physical_id or "-", state],
                            d.description if d.available else d.unavailable_reason, "" if d.available else "yellow"))
    console = Console(highlight=False)
    print_table(console, ["device", "type", "plugin", "physical id", "state"], rows)
    dists: dict[str, list[str]] = {}
    for rec in reg.plugins.values():
        dists.setdefault(rec.distribution, []).append(rec.name)
    lines = ["plugins: " + "; ".join(f"{', '.join(names)} ({dist})" for dist, names in dists.items())]
    profiles: dict[tuple[str, ...], list[str]] = {}
    for d in reg.devices():
        if d.profiles:
            profiles.setdefault(d.profiles, []).append(d.name)
    lines += [f"device profiles (--device-profile NAME, an EMULATION): {', '.join(names)} on {', '.join(devs)}"
              for names, devs in profiles.items()]
    lines += [f"one physical device ({group[0].physical_id}) is reached as: {', '.join(d.name for d in group)}"
              for group in reg.same_silicon()]
    for line in lines:
        print_wrapped(console, line)
    return 0


def cmd_models(args) -> int:
    """The packaged models: name, size, file (gemma3's is assembled from its package on first use)."""
    from ..model.default import CATALOG
    for m in CATALOG:
        try:
            path = m.location()
        except FileNotFoundError as e:
            out(f"{m.name}  not installed: {e}\n")
            continue
        size = f"{path.stat().st_size / 2**20:.1f} MiB" if path.exists() else f"assembled from {m.package} on first use"
        out(f"{m.name:<8} {size}  {m.description}\n{'':<8} {path}\n")
    out("use one with -m NAME on run, check, split, info, perplexity and bench\n")
    return 0


def cmd_conformance(args) -> int:
    """The conformance suite through this interpreter's pytest (a system pytest cannot import framework)."""
    import subprocess
    from importlib.metadata import entry_points
    from importlib.util import find_spec
    if find_spec("pytest") is None:
        return fail(f"the conformance suite runs on pytest, which {sys.executable} lacks: "
                    f"{sys.executable} -m pip install pytest")
    plugin = "framework.conformance.pytest_plugin"
    # pytest must know --device before it imports the suite: from the pytest11 entry point, or named with -p
    registered = any(ep.value.split(":")[0].strip() == plugin for ep in entry_points(group="pytest11"))
    extra = [a for a in args.pytest_args if a != "--"]
    command = [sys.executable, "-m", "pytest", *([] if registered else ["-p", plugin]),
               "--pyargs", "framework.conformance", *(f"--device={d}" for d in args.device or ()), *extra]
    err.print(" ".join(command), soft_wrap=True, highlight=False)
    return subprocess.call(command)


def cmd_info(args) -> int:
    """Describe a file from its own metadata, whether or not this project can run its architecture."""
    from collections import Counter

    from ..model.arch import ARCHITECTURES
    from ..model.gguf_file import open_model_file
    from ..model.hparams import MetadataError, read_hparams
    from ..model.metadata import describe
    from ..model.tokenizer import tokenizer_from_metadata

    from ..model.default import resolve_model
    path = resolve_model(args.model)
    with err.status(f"reading {path.name}"):
        file = open_model_file(path)
    meta, arch = file.metadata, file.architecture
    cls = ARCHITECTURES.get(arch)
    types = Counter(t.dtype.name for t in file.tensors.values())
    size = sum(t.nbytes for t in file.tensors.values())
    support = ("supported" if cls else f"NOT SUPPORTED by this project (it runs {', '.join(sorted(ARCHITECTURES))}): "
               f"described from the file's metadata, it cannot be run")
    def text(key: str, default: str = "-") -> str:
        """A string key as it is, anything else described (info shows a broken file, it does not fail)."""
        value = meta.get(key)
        return default if value is None else value if isinstance(value, str) else f"({describe(value)})"

    lines = [f"file          {file.path}", f"name          {text('general.name', file.path.name)}",
             f"architecture  {arch or text('general.architecture', '(none)')}, {support}"]
    try:
        hp = cls.read_hparams(meta) if cls else read_hparams(meta)
        lines += [
            f"layers        {hp.n_layer}, embedding {hp.n_embd}, feed-forward {hp.n_ff}",
            f"attention     {hp.n_head} heads, {hp.n_head_kv} kv heads, head size {hp.head_dim}"
            + (f", sliding window {hp.sliding_window} on {sum(hp.swa_layers)} layers" if hp.sliding_window else ""),
            f"rope          base {hp.rope_base:g}" + (f" (sliding layers {hp.rope_base_swa:g})" if hp.sliding_window
                                                       else "") + (f", {cls.rope_mode} mode" if cls else "")
            + f", {hp.n_rot} dimensions",
            f"context       {hp.n_ctx_train} tokens (trained)"]
        if cls is not None and cls.recurrent:
            from ..model.hparams import read_ssm_hparams
            ssm = read_ssm_hparams(meta, hp.n_layer)
            lines.append(f"linear attn   {sum(ssm.recurrent)} of {hp.n_layer} layers (GatedDeltaNet), {ssm.n_v_heads} "
                         f"value heads, {ssm.n_k_heads} key heads, state {ssm.d_state}, conv kernel {ssm.d_conv}")
    except (MetadataError, KeyError) as e:
        keys = {k[len(arch) + 1:]: v for k, v in meta.items() if k.startswith(f"{arch}.") and not isinstance(v, list)}
        lines.append(f"hyper-params  {', '.join(f'{k} {v}' for k, v in keys.items()) or '(none)'} "
                     f"(not all this project would need: {e})")
    lines.append(f"tensors       {len(file.tensors)}, {size / 2**20:.1f} MiB: "
                 + ", ".join(f"{n} {k}" for k, n in types.most_common()))
    try:
        tok = tokenizer_from_metadata(meta)
        lines.append(f"tokenizer     {text('tokenizer.ggml.model')} (pre: {text('tokenizer.ggml.pre')}), "
                     f"{tok.n_vocab} tokens, bos {tok.bos_id}, eos {tok.eos_id}, end-of-generation "
                     f"{sorted(tok.eog_ids)}, add bos {tok.add_bos}")
    except (ValueError, KeyError) as e:
        tokens = meta.get("tokenizer.ggml.tokens", ())
        count = f"{len(tokens)} tokens" if isinstance(tokens, list) else f"tokens: {describe(tokens)}"
        lines.append(f"tokenizer     {text('tokenizer.ggml.model', '(none)')} (pre: {text('tokenizer.ggml.pre')}), "
                     f"{count}; not usable here: {e}")
    has_template = bool(meta.get("tokenizer.chat_template"))
    lines.append(f"chat template {'yes' if has_template else 'no (a built-in one is used with --chat)'}")
    out("\n".join(lines) + "\n")
    return 0


def cmd_perplexity(args) -> int:
    from ..runtime.perplexity import perplexity_of_file, windows_per_step
    from ..runtime.session import Session
    path = Path(args.file)
    if not path.is_file():
        return fail(f"text file {path} is a folder" if path.is_dir() else f"text file not found: {path}")
    devices = _devices(args)
    model = load_model(args.model)
    with weight_progress() as progress:
        # a cache for as many windows as one batched step scores
        n_ctx = args.ctx * windows_per_step(model, devices, args.ctx, args.batch)
        session = Session(model, devices, n_ctx=n_ctx, n_batch=args.batch, progress=progress,
                          memory_caps=memory_caps(args.device_memory), check_values=args.check_values)
    result = perplexity_of_file(session, path, args.ctx, progress=_perplexity_progress())
    out(f"perplexity {result.perplexity:.4f} over {result.n_tokens} tokens "
        f"({len(result.nll)} scored, window {args.ctx}), {result.tokens_per_second:.1f} tok/s\n")
    return 0


def _perplexity_progress(every: float = 10.0):
    """A line after the first window and then at most every `every` seconds: windows, tokens, the share
    of the file read, and an estimate of the time left."""
    last = [-every]

    def show(p) -> None:
        if p.seconds - last[0] < every and p.fraction < 1.0:
            return
        last[0] = p.seconds
        left = p.seconds_left
        eta = "" if left is None else f", about {_duration(left)} left"
        err.print(f"window {p.windows}: {p.tokens} tokens, {p.fraction:.1%} of the text in {_duration(p.seconds)}"
                  f"{eta}")
    return show


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cmd_bench(args) -> int:
    from ..bench import run_bench
    return run_bench(args)


def cmd_settings(args) -> int:
    from .state import cmd_settings
    return cmd_settings(args)


def cmd_cache(args) -> int:
    from .state import cmd_cache
    return cmd_cache(args)


COMMANDS = {"run": cmd_run, "check": cmd_check, "split": cmd_split, "serve": cmd_serve, "backends": cmd_backends,
            "models": cmd_models, "info": cmd_info, "perplexity": cmd_perplexity, "bench": cmd_bench,
            "conformance": cmd_conformance, "settings": cmd_settings, "cache": cmd_cache}

if __name__ == "__main__":
    sys.exit(main())
