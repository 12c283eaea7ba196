"""The `framework` command: run, info, check, backends and the other commands, their reports, and their
one-line errors with one exit status per kind. (tests/test_readme.py runs every command of the README.)"""

import json
import re
from pathlib import Path

import pytest
from conftest import model_path, reference

from framework.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_streams_llama_cpps_greedy_text_and_summarises(capsys, tmp_path):
    ref = reference("smollm2")[0]
    p = ref["prompts"][0]
    plan = tmp_path / "plan.json"
    code, out, err = run_cli(capsys, "run", p["prompt"], "-m", "smollm2", "-n", "6", "--ctx", "256",
                             "--plan", str(plan))
    assert code == 0
    assert out.startswith(p["prompt"] + p["greedy_text"][:8])           # ' Paris.\n\n' and on
    # 6 tokens: the first from the prefill's logits, 5 decode steps; the last token is not run (llama.cpp's count)
    assert "prefill 5 tokens" in err and "decode 5 tokens at" in err and "6 tokens generated" in err, err
    assert "placement" in err and "cpu" in err
    record = json.loads(plan.read_text())
    assert record["devices"] == ["cpu"] and any(k.startswith("decode") for k in record["plans"])
    # the figures the summary printed: each phase's speed, each device's time, runs, copies and programs
    speed = re.search(r"decode 5 tokens at ([\d.]+) tok/s", err)
    assert record["speed"]["decode"]["tokens"] == 5 and record["speed"]["prefill"]["tokens"] == 5
    assert f"{record['speed']['decode']['tokens_per_second']:.1f}" == speed.group(1)
    cpu = record["device_times"]["cpu"]
    assert cpu["runs"] > 0 and cpu["programs"] >= 1 and re.search(rf"\b{cpu['seconds']:.2f} s\b", err), err


def test_run_chat_on_a_base_model_says_what_will_happen(capsys):
    code, out, err = run_cli(capsys, "run", "Say hi", "-n", "2", "--chat", "--ctx", "128")
    err = " ".join(err.split())
    assert code == 0 and "has no chat template: it is a base model" in err, err
    assert "built-in gemma3 template" in err and "expect a continuation or repetition" in err and "-m smollm2" in err


def test_info_names_architecture_sizes_types_and_tokenizer(capsys):
    code, out, _ = run_cli(capsys, "info", "-m", "smollm2")
    assert code == 0
    for part in ("architecture  llama", "layers        30", "9 heads, 3 kv heads", "Q4_1", "gpt2 (pre: smollm)",
                 "49152 tokens"):
        assert part in out, part


@pytest.mark.parametrize("argv, expect", [
    (["run", "-m", "/no/such/model.gguf", "-n", "1"], "model file not found: /no/such/model.gguf"),
    (["check", "-m", "smollm3"], "packaged models go by name: smollm2, gemma3"),
    (["run", "", "-m", "smollm2"], "the prompt is empty and SmolLM2-135M-Instruct.Q4_1.gguf adds no"),
    (["run", "--backends", "tpu", "-n", "1"], "unknown backend 'tpu'"),
    (["info", "-m", "/etc/hostname"], "is not a GGUF file"),
    (["perplexity", "-f", "/no/such.txt"], "text file not found: /no/such.txt"),
    (["run", "--temp", "-1", "-n", "1"], "--temp must be 0 (greedy) or positive"),
    (["run", "--top-p", "2", "-n", "1"], "--top-p must be in (0, 1]"),
])
def test_bad_input_is_a_one_line_error_naming_it(capsys, argv, expect):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert expect in " ".join(err.split())
    assert "Traceback" not in err


def test_unknown_backend_lists_the_devices(capsys):
    code, _, err = run_cli(capsys, "run", "--backends", "nope", "-n", "1")
    assert code == 2 and "cpu (CPU, available)" in err


def test_prompt_longer_than_the_context_is_refused(capsys):
    code, _, err = run_cli(capsys, "run", "word " * 200, "-m", str(model_path("smollm2")), "--ctx", "64", "-n", "4")
    assert code == 2 and "exceed the context length 64" in err and "--ctx" in err


def test_a_model_file_without_m_is_named_in_the_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["info", "model.gguf"])
    assert e.value.code == 2 and "(a model is named with -m: -m model.gguf)" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_bad_numbers_are_rejected_by_the_parser(capsys, value):
    with pytest.raises(SystemExit) as e:
        main(["run", "--ctx", value])
    assert e.value.code == 2
    assert "--ctx" in capsys.readouterr().err


def test_check_reserves_without_loading(capsys):
    code, out, _ = run_cli(capsys, "check", "-m", "smollm2", "--prompt-tokens", "16", "-n", "8")
    assert code == 0 and "nothing was loaded or compiled" in out and "decode[tokens=1,kv=256]" in out


def test_ctrl_c_ends_cleanly_with_the_summary():
    """SIGINT while tokens stream: generation stops, the summary is printed, exit status 130."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "framework.cli.main", "run", "Once upon a time", "-m",
                             str(model_path("smollm2")), "-n", "400", "--ctx", "512"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.read(len("Once upon a time") + 3)        # the prompt, then generated text
    assert first.startswith("Once upon a time")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "interrupted" in err and "decode" in err and "Traceback" not in err


def test_empty_prompt_is_a_prefill_of_the_bos_token(capsys):
    code, out, err = run_cli(capsys, "run", "", "-n", "2", "--ctx", "128")         # gemma3 adds a BOS token
    assert code == 0 and "prefill 1 token at" in err and "decode 1 token at" in err, err


# -- emulated devices, by one option ---------------------------------------------------------------------

def test_backends_npu_without_one_names_the_emulation_option(capsys, registry):
    if any(d.type.value == "NPU" and d.available for d in registry.devices()):
        pytest.skip("this machine has an NPU")
    code, _, err = run_cli(capsys, "check", "-m", "smollm2", "--backends", "npu,cpu")
    err = " ".join(err.split())
    assert code == 2 and "alias 'npu' matches no available NPU device" in err
    assert "--backends npu --device-profile xdna or xdna2 (xdna:0 as xdna on the xdna host arm (numpy))" in err
    assert "--backends npu --device-profile npu37xx or npu40xx (openvino:CPU as npu37xx)" in err


@pytest.mark.parametrize("profile", ["npu37xx", "npu40xx"])
def test_the_npu_alias_finds_openvinos_emulation_of_an_intel_npu(capsys, registry, profile):
    """`--backends npu,cpu --device-profile npu37xx` (the card's own command): the emulated OpenVINO device takes
    the type of what it emulates, an NPU, labelled EMULATION, and the run goes through on it."""
    if any(d.type.value == "NPU" and d.available for d in registry.devices()):
        pytest.skip("this machine has an NPU, which the alias would find first")
    code, out, err = run_cli(capsys, "run", "Hi", "-m", "smollm2", "-n", "3", "--ctx", "64", "--backends", "npu,cpu",
                             "--device-profile", profile)
    err = " ".join(err.split())
    assert code == 0, err
    assert out.startswith("Hi") and f"on openvino:CPU (EMULATION of {profile}), cpu" in err
    assert "3 tokens generated" in err


def test_device_profile_must_be_one_a_plugin_offers(capsys):
    code, _, err = run_cli(capsys, "check", "-m", "smollm2", "--backends", "npu,cpu", "--device-profile", "tpu9")
    err = " ".join(err.split())
    assert code == 2 and "--device-profile tpu9: no plugin offers a profile of that name" in err
    assert "xdna, xdna2 (xdna:0)" in err and "npu37xx, npu40xx (openvino:CPU" in err


# -- reports ------------------------------------------------------------------------------------------------

def test_fallbacks_are_grouped_by_op_device_and_reason_code_and_strict_lists_every_node(capsys):
    """The xdna host arm refuses weight types without a tile form with a reason that names each weight:
    one line per op, device and code all the same; --strict names every node."""
    args = ["check", "-m", "gemma3", "--backends", "xdna:0,cpu", "--device-profile", "xdna2", "--prompt-tokens",
            "8", "-n", "2"]
    code, out, _ = run_cli(capsys, *args)
    assert code == 0
    lines = [ln.strip() for ln in out.splitlines() if "fallback:" in ln]
    dtype = [ln for ln in lines if ln.startswith("fallback: ") and " MUL_MAT nodes would run on cpu" in ln
             and "unsupported_dtype" in ln]
    assert len(dtype) == 2, lines                                         # one per phase, for many weights
    assert re.search(r"fallback: (\d+) MUL_MAT nodes would run on cpu \(first: \S+\); xdna:0: unsupported_dtype: "
                     r"weight type \w+ \(blk\.\d+\.\S+\) has no exact tile form", dtype[0]), dtype[0]
    assert int(re.search(r"fallback: (\d+)", dtype[0]).group(1)) > 20
    assert len(lines) == 2 * len(set(lines)) <= 20              # the same few groups in each of the two phases
    code, _, err = run_cli(capsys, *args, "--strict")
    assert code == 1 and "[strict_fallback]" in err
    # the banner groups its nodes too: a line per op, device and reason, never one per node
    banner = err.split("[strict_fallback]", 1)[1].split("fix:", 1)[0]
    total = int(re.search(r"--strict: (\d+) nodes of the (prefill|decode)\S* graph", banner).group(1))
    listed = [ln for ln in banner.splitlines() if re.match(r"\s+\d+ \w+ nodes? -> cpu \(first: ", ln)]
    assert listed and len(listed) == len(set(lines)) < total, banner
    assert sum(int(ln.split()[0]) for ln in listed) == total
    assert any(re.search(r"MUL_MAT nodes -> cpu \(first: \S+, \[.*; also \S+, \S+ and \d+ more\); xdna:0: "
                         r"unsupported_dtype", ln) for ln in listed), listed


def test_tables_fit_80_columns_and_are_not_padded_when_piped(capsys):
    from framework.terminal import Row, render
    code, out, _ = run_cli(capsys, "backends")
    assert code == 0 and not [ln for ln in out.splitlines() if ln != ln.rstrip()]
    rows = [ln for ln in out.splitlines() if ln and not ln.startswith((" ", "plugins:", "device profiles", "one "))]
    assert rows[0].split() == ["device", "type", "plugin", "physical", "id", "state"]
    assert max(len(ln) for ln in rows) <= 80, rows
    assert any(ln.startswith("    ") and len(ln) > 80 for ln in out.splitlines())   # piped: a reason is one line
    wrapped = render(["device", "state"], [Row(["xdna:0", "unavailable"], "word " * 60)], width=80)
    assert len(wrapped) > 3 and max(len(ln) for ln in wrapped) <= 80


def test_run_summary_has_no_wrapped_lines_and_counts_in_words(capsys):
    code, _, err = run_cli(capsys, "run", "Hello there", "-m", "smollm2", "-n", "1", "--ctx", "128")
    assert code == 0 and "decode 0 tokens; 1 token generated" in err, err
    assert re.search(r"^model .* on cpu$", err, re.M)                       # one line, not wrapped at 80
    # the memory it holds in the prefill's plan (no decode ran), of the host memory the cpu plugin declares
    assert re.search(r"^cpu\s+815 / -\s+1 / -\s+1\s+\d+\.\d\d s\s+0 B\s+\d+\.\d / - of \d+\.\d MiB$", err, re.M), err


def test_a_compile_is_announced_to_the_progress_display(registry):
    from framework.model.model import Model
    from framework.runtime.session import Session
    said = []
    session = Session(Model(model_path("smollm2")), registry.select("cpu"), n_ctx=128, n_layers=1,
                      progress=lambda what, done, total: said.append(what))
    session.plan(4, 0)
    assert said[-1].startswith("compiling fragment 0 on cpu") and "blk.0.attn_q.weight" in said


# -- errors: the traceback on --debug, a line of their own, one exit code per kind ---------------------------

def _crash(step: int) -> None:
    raise ZeroDivisionError(f"run {step} divided by zero")


class _CrashingProgram:
    def __init__(self, inner):
        self.inner, self.runs = inner, 0

    def run(self, args):
        self.runs += 1
        if self.runs > 1:                    # the prefill works; the first decode step fails
            _crash(self.runs)
        return self.inner.run(args)


@pytest.fixture
def crashing(monkeypatch):
    """A plugin registered through the registry whose device fails in its first decode step."""
    from framework.contract import hookimpl
    from framework import registry as registry_module
    from framework.plugins.cpu.device import CpuDevice

    class CrashingDevice(CpuDevice):
        name = "crashing:0"

        def compile(self, fragment):
            return _CrashingProgram(super().compile(fragment))

    class Plugin:
        @hookimpl
        def framework_devices(self):
            return [CrashingDevice()]

    def with_crashing():
        reg = registry_module.Registry().load_entry_points()
        reg.register(Plugin(), "crashing")
        return reg

    monkeypatch.setattr(registry_module, "default_registry", with_crashing)


@pytest.mark.parametrize("debug", [False, True])
def test_a_plugins_failure_starts_on_a_new_line_and_debug_shows_its_traceback(capsys, crashing, debug):
    code, out, err = run_cli(capsys, "run", "Hi", "-m", "smollm2", "--backends", "crashing:0", "-n", "3", "--ctx",
                             "128", *(["--debug"] if debug else []))
    assert code == 3
    assert out.startswith("Hi") and out.endswith("\n")                     # the streamed line was ended first
    assert "device crashing:0 failed while running fragment 0" in err and "ZeroDivisionError: run 2" in err
    if debug:
        assert "Traceback" in err and re.search(rf'File "{re.escape(__file__)}", line \d+, in _crash', err), err
    else:
        assert "Traceback" not in err and "--debug shows the traceback" in err


@pytest.mark.parametrize("command", [["run", "-n", "2"], ["check"], ["split"], ["perplexity", "-f", "README.md"],
                                     ["bench", "--reservation-only"]])
def test_a_capability_error_has_exit_status_1_on_every_command(capsys, monkeypatch, command):
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_REFUSE", "ROPE")            # a program between every two ROPEs
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_MAX_PROGRAMS", "2")
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    code, _, err = run_cli(capsys, *command, "-m", "smollm2", "--backends", "example:0,cpu")
    assert code == 1 and "[program_budget]" in " ".join(err.split()), err


def _framework_imports(path: Path) -> set[str]:
    """The framework modules a file imports, relative imports resolved."""
    import ast
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            found.add(f"{base}.{node.module}" if node.level and node.module else base if node.level else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m and m.startswith("framework")}


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("front, others", [("framework/serve", ("framework.cli", "framework.bench")),
                                           ("framework/bench.py", ("framework.cli", "framework.serve"))])
def test_cli_serve_and_bench_share_only_what_sits_below_them(front, others):
    """Exit codes, streams, tables and device choice live below the three front ends (framework.exit_codes,
    framework.terminal): neither the server nor the benchmark imports the command line that starts them."""
    where = ROOT / front
    files = sorted(where.rglob("*.py")) if where.is_dir() else [where]
    climbing = {f"{f.relative_to(ROOT)} imports {m}" for f in files for m in _framework_imports(f)
                if m.startswith(others)}
    assert not climbing


def test_the_command_line_loads_plugins_only_through_the_registry():
    """No second loader beside the registry (which validates plugins and honours the block list)."""
    for f in sorted((ROOT / "framework/cli").rglob("*.py")):
        text = f.read_text()
        assert ".load()" not in text and "ENTRY_POINT_GROUP" not in text, f


# -- the options a llama.cpp user expects ------------------------------------------------------------------

def _subparsers():
    import argparse

    from framework.cli.main import build_parser
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_every_option_with_a_default_says_it_in_its_help():
    """An option that has a default states it (llama.cpp's --help does): a user should not read the source."""
    import argparse
    silent = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, sp in _subparsers().items()
              for a in sp._actions
              if a.default not in (None, False, argparse.SUPPRESS) and "default" not in (a.help or "")]
    assert not silent


def test_cache_help_names_every_cache():
    """`framework cache --help` names every cache the project and its plugins register (loaded as `framework
    cache` loads them)."""
    from framework import caches
    from framework.cli.state import load_plugins
    from framework.model import gguf_file  # noqa: F401 - registers the GGUF index cache
    assert not load_plugins()
    text = _subparsers()["cache"].format_help()
    assert caches.CACHES and all(name in text for name in caches.CACHES), text
    # the cpu plugin registers its numba cache when its kernels are first imported: named all the same
    assert all(name in text for name in ("gguf-index", "numba", "opencl", "openvino", "xdna")), text


@pytest.mark.parametrize("command", ["run", "serve", "perplexity", "bench"])
def test_threads_is_an_option_of_every_command_that_computes(command):
    flags = {s for a in _subparsers()[command]._actions for s in a.option_strings}
    assert {"-t", "--threads"} <= flags


def test_threads_reach_the_cpu_kernels_and_openvinos_cpu_device(capsys, monkeypatch):
    """-t as bench applies it: numba's pool for the cpu plugin, INFERENCE_NUM_THREADS for openvino:CPU (made
    with it, the process's environment left as it was)."""
    import os

    import numba

    from framework.terminal import select_devices
    monkeypatch.delenv("FRAMEWORK_OPENVINO_THREADS", raising=False)
    before = numba.get_num_threads()
    try:
        code, out, _ = run_cli(capsys, "run", "Hi", "-m", "smollm2", "-n", "2", "--ctx", "64", "-t", "1")
        assert code == 0 and out.startswith("Hi") and numba.get_num_threads() == 1
        (ov,) = select_devices("openvino:CPU", threads=1)
        assert ov.compiling.threads == 1 and ov.compile_config()["INFERENCE_NUM_THREADS"] == 1
        assert "FRAMEWORK_OPENVINO_THREADS" not in os.environ
    finally:
        numba.set_num_threads(before)


def test_a_prompt_from_a_file(capsys, tmp_path):
    """-f FILE: the file's text is the prompt (one trailing newline dropped, as llama.cpp does), the same
    greedy text as the prompt given as an argument; a file and an argument together are refused."""
    ref = reference("smollm2")[0]["prompts"][0]
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(ref["prompt"] + "\n")
    code, out, err = run_cli(capsys, "run", "-f", str(prompt), "-m", "smollm2", "-n", "4", "--ctx", "128")
    assert code == 0, err
    assert out.startswith(ref["prompt"] + ref["greedy_text"][:6])
    code, _, err = run_cli(capsys, "run", "Hi", "-f", str(prompt), "-m", "smollm2")
    assert code == 2 and "a prompt argument and -f" in err
    prompt.write_bytes(b"caf\xe9\n")
    code, _, err = run_cli(capsys, "run", "-f", str(prompt), "-m", "smollm2")
    assert code == 2 and "is not UTF-8 text: byte 0xe9 at byte offset 3" in " ".join(err.split())


def _converse(messages: list[str], tmp_path) -> str:
    """`framework run -cnv` with the messages on a pipe to its stdin; returns its stdout."""
    import os
    import subprocess
    import sys
    code = "import sys; from framework.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "run", "-m", "smollm2", "-cnv", "-n", "12", "--ctx", "256"],
                          input="".join(m + "\n" for m in messages), capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FRAMEWORK_CACHE": os.environ.get("FRAMEWORK_CACHE", str(tmp_path))})
    assert done.returncode == 0, done.stderr
    assert "tokens generated" in done.stderr and "placement" in done.stderr
    return done.stdout


def test_conversation_mode_keeps_the_history_and_clear_forgets_it(tmp_path):
    """-cnv through a pipe: a reply depends on the messages before it, and after /clear the model answers as
    in a fresh conversation, token for token (the cache kept the shared prefix and was rewound past it)."""
    fresh = _converse(["What is my name?"], tmp_path)
    told = _converse(["My name is Ada.", "What is my name?"], tmp_path)
    cleared = _converse(["My name is Ada.", "", "What is my name?", "/clear", "What is my name?", "/exit", "Hi"],
                        tmp_path)
    assert fresh.strip() and not told.endswith(fresh)        # the first message changed the second reply
    assert cleared == told + fresh                            # blank lines skipped, /clear forgets, /exit ends


def test_conformance_without_device_tests_every_available_device(capfd, registry):
    """As docs/plugin-guide.md says: no --device, every available device (here: collected, not run)."""
    code = main(["conformance", "-k", "GET_ROWS and F32", "--collect-only", "-q", "-p", "no:cacheprovider"])
    out = capfd.readouterr().out
    assert code == 0, out
    tested = set(re.findall(r"\[([^\[\]-]+:?[^\[\]-]*)-GET_ROWS", out))
    assert tested == {d.name for d in registry.devices() if d.available}, out[-2000:]


def test_backends_fits_an_80_column_terminal():
    """On a terminal of 80 columns (a pseudo-terminal, COLUMNS=80) no line of `framework backends` is wider:
    long reasons and the closing lines wrap under what they belong to."""
    import os
    import pty
    import subprocess
    import sys
    leader, follower = pty.openpty()
    code = "import sys; from framework.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "backends"], stdout=follower, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "80", "TERM": "xterm"})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:                  # the terminal closes when the command ends
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())
    lines = text.replace("\r", "").splitlines()
    assert any(ln.startswith("device profiles") for ln in lines) and any(ln.startswith("    ") for ln in lines)
    assert max(len(ln) for ln in lines) <= 80, [ln for ln in lines if len(ln) > 80]


def test_conversation_mode_on_a_terminal():
    """-cnv on a terminal (a pseudo-terminal): it says how to use it, prompts with '> ' for each message,
    answers, and ends at /exit with the summary."""
    import os
    import pty
    import select
    import subprocess
    import sys
    leader, follower = pty.openpty()
    code = "import sys; from framework.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "run", "-m", "smollm2", "-cnv", "-n", "6", "--ctx", "128"],
                            stdin=follower, stdout=follower, stderr=follower, env={**os.environ, "TERM": "dumb"})
    os.close(follower)
    seen = b""

    def until(text: bytes, start: int = 0) -> None:
        nonlocal seen
        while text not in seen[start:]:
            ready, _, _ = select.select([leader], [], [], 300)
            assert ready, f"no {text!r} from framework run -cnv: {seen[-2000:]!r}"
            seen += os.read(leader, 65536)

    try:
        until(b"/exit or Ctrl-D ends it")
        until(b"> ")
        asked = len(seen)
        os.write(leader, b"Hi\n")
        until(b"\n> ", asked)                   # the answer, then the next prompt
        answer = seen[asked:].rsplit(b"\n> ", 1)[0].split(b"Hi", 1)[1].strip()
        assert answer and b"<|im_" not in answer, seen[-500:]
        os.write(leader, b"/exit\n")
        until(b"tokens generated")
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill() if proc.poll() is None else None
        os.close(leader)
