"""Bad arguments and inputs, and faults: each is one line naming what is wrong and an exit status, never a
traceback. In-process through framework.cli.main.main, except the signals, which need a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from framework.cli import main
from framework.model.default import model_path

SMOLLM2 = str(model_path("smollm2"))


def cli(capsys, *args) -> tuple[int, str]:
    rc = main(list(args))
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def one_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_empty_prompt_is_named(capsys):
    rc, text = cli(capsys, "run", "-m", SMOLLM2, "-n", "1", "")
    assert rc == 2 and "the prompt is empty" in one_error(text) and "beginning-of-sequence" in text


def test_a_prompt_of_binary_bytes_is_named_with_its_offset(capsys):
    junk = os.fsdecode(b"ab\xff\xfe\x80junk")            # what Python makes of non-UTF-8 bytes in argv
    rc, text = cli(capsys, "run", "-m", SMOLLM2, "-n", "1", junk)
    assert rc == 2 and "not UTF-8 text: byte 0xff at byte offset 2" in one_error(text)


@pytest.mark.parametrize("where,words", [
    ("folder", "that is a folder"),
    ("/sys/plan.json", "cannot be written"),               # a read-only folder, for root too
    ("/sys/kernel/notes", "the file cannot be written"),   # a read-only file, for root too
    ("missing/plan.json", "does not exist"),
])
@pytest.mark.parametrize("command", ["run", "check", "split"])
def test_unwritable_outputs_are_named_before_any_work(capsys, tmp_path, where, words, command):
    target = {"folder": str(tmp_path), "missing/plan.json": str(tmp_path / "missing" / "plan.json")}.get(where, where)
    option = "-o" if command == "split" else "--plan"
    args = {"run": ["run", "-m", SMOLLM2, "-n", "1"], "check": ["check", "-m", SMOLLM2],
            "split": ["split", "-m", SMOLLM2]}[command]
    t0 = time.perf_counter()
    rc, text = cli(capsys, *args, option, target)
    line = one_error(text)
    assert rc == 2 and option in line and words in line, line
    assert time.perf_counter() - t0 < 10                             # before the model is loaded


@pytest.mark.parametrize("option,value,words", [
    ("--temp", "nan", "--temp must be 0 (greedy) or positive (and finite), got nan"),
    ("--temp", "inf", "got inf"),
    ("--temp", "-1", "got -1.0"),
    ("--top-p", "nan", "--top-p must be in (0, 1]"),
    ("--seed", "-3", "--seed must be 0 or more"),
])
def test_bad_numbers_are_named(capsys, option, value, words):
    rc, text = cli(capsys, "run", "-m", SMOLLM2, "-n", "1", option, value, "hi")
    assert rc == 2 and words in one_error(text)


@pytest.mark.parametrize("option,value,words", [
    ("--port", "70000", "argument --port: 70000 is not a port number (0 to 65535)"),
    ("--port", "http", "argument --port: 'http' is not a port number"),
    ("--queue", "-1", "argument --queue: -1 must be 0 or more"),
    ("--shutdown-timeout", "nan", "argument --shutdown-timeout: nan must be a finite number of seconds"),
])
def test_bad_serve_numbers_are_usage_errors(capsys, option, value, words):
    """Refused by the parser, before any model is loaded (a port out of range was an OverflowError from
    the socket once the models were reserved)."""
    with pytest.raises(SystemExit) as e:
        main(["serve", "-m", SMOLLM2, option, value])
    text = capsys.readouterr().err
    assert e.value.code == 2 and words in text and "Traceback" not in text, text


def test_a_context_that_cannot_fit_names_the_kv_cache(capsys):
    rc, text = cli(capsys, "run", "-m", SMOLLM2, "-n", "1", "--ctx", "1000000000", "hi")
    line = one_error(text)
    assert rc == 1 and "[out_of_memory] device cpu has" in line and "caches" in line and "TiB" in line
    rc, text = cli(capsys, "check", "-m", SMOLLM2, "--ctx", "100000000")
    assert rc == 1 and "caches 4394531.2 MiB = 4.2 TiB (60 tensors of 100000000 rows" in one_error(text)


def test_perplexity_of_a_file_that_is_not_utf8_names_the_file_and_offset(capsys, tmp_path):
    bad = tmp_path / "text.txt"
    bad.write_bytes("Hello world, a text of several tokens. ".encode() * 3 + b"caf\xe9 au lait")
    offset = len("Hello world, a text of several tokens. ".encode() * 3) + 3
    rc, text = cli(capsys, "perplexity", "-m", SMOLLM2, "-f", str(bad))
    line = one_error(text)
    assert rc == 2 and str(bad) in line and f"byte 0xe9 at byte offset {offset}" in line
    rc, text = cli(capsys, "perplexity", "-m", SMOLLM2, "-f", str(tmp_path))
    assert rc == 2 and "is a folder" in one_error(text)


# -- Ctrl-C at any moment ------------------------------------------------------------------------------
def _interrupt_on_call(monkeypatch, owner, name: str, after: int = 0):
    """Make owner.name raise KeyboardInterrupt (what a SIGINT raises) on its call number ``after``."""
    real = getattr(owner, name)
    calls = [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, interrupted)


@pytest.mark.parametrize("moment", ["reading the file", "unpacking weights", "compiling", "generating",
                                    "writing the plan"])
def test_ctrl_c_at_any_moment_ends_with_a_line_and_130(capsys, monkeypatch, tmp_path, moment):
    """Ctrl-C while the model file is read, while weights are unpacked (half-way), while a fragment is
    compiled, while tokens are generated, while the plan is written: exit 130, one line, no traceback, and
    no plan file but a whole one."""
    from framework import caches
    from framework.model import gguf_file
    from framework.plugins.cpu.device import CpuDevice
    from framework.runtime import greedy
    monkeypatch.setenv("FRAMEWORK_CACHE", "off")
    owner, name, after = {"reading the file": (gguf_file, "_read_header", 0),
                          "unpacking weights": (CpuDevice, "load_weight", 130),
                          "compiling": (CpuDevice, "compile", 0), "generating": (greedy, "greedy", 1),
                          "writing the plan": (caches.os, "replace", 0)}[moment]
    _interrupt_on_call(monkeypatch, owner, name, after)
    plan = tmp_path / "plan.json"
    rc, text = cli(capsys, "run", "-m", SMOLLM2, "-n", "3", "--ctx", "256", "--backends", "cpu", "--plan", str(plan),
                   "Once upon a time")
    assert rc == 130 and "interrupted" in text and "Traceback" not in text, text[-2000:]
    if moment == "generating":
        assert "interrupted" in text and "decode" in text            # the summary of what ran
        json.loads(plan.read_text())                                 # and the plans that ran
    else:
        assert not plan.exists()
    assert not list(tmp_path.glob(".plan.json.*"))                   # no temporary file left behind


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_mid_generation_ends_with_its_status(sig, code, word):
    proc = subprocess.Popen([sys.executable, "-m", "framework", "run", "-m", SMOLLM2, "-n", "400", "--ctx", "512",
                             "Once upon a time"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "FRAMEWORK_BLOCK_PLUGINS": "openvino,vulkan,xdna"})
    seen = b""
    while len(seen) < len("Once upon a time") + 8:                # wait for generated text
        chunk = proc.stdout.read1(64)
        assert chunk, proc.stderr.read().decode()
        seen += chunk
    proc.send_signal(sig)
    out, errs = proc.communicate(timeout=120)
    text = errs.decode()
    assert proc.returncode == code and word in text and "Traceback" not in text, (proc.returncode, text)
