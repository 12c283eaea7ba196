"""Every command of README.md works as written: the README's ```sh blocks are read, and each command
line must have an entry in COMMANDS below (and each entry a line in the README), which runs it.

A `framework` command runs in this process, through the same `main()` as `.venv/bin/framework`, in a
fresh folder (so that `--plan plan.json` and `-o split.html` land there), with at most a few
arguments appended that only make it cheaper (argparse takes the last `-n`): a handful of tokens
instead of 64, one conformance case family instead of all. A `make` target is checked with
`make -n` (the recipe it would run), and `make run`'s framework command and `make clean-cache` are
run for real.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import reference

from framework.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PLAIN = re.compile(r"\x1b\[[0-9;]*m")


def readme_commands() -> list[str]:
    """The command lines of the README's sh blocks, without their comments."""
    text = README.read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command = line.split(" #", 1)[0].strip()
            if command:
                lines.append(command)
    return lines


def run_framework(capsys, command: str, *cheaper: str) -> tuple[int, str, str]:
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/framework", command
    code = main(argv[1:] + list(cheaper))
    captured = capsys.readouterr()
    return code, captured.out, PLAIN.sub("", captured.err)


def make_recipe(target: str) -> str:
    """What `make TARGET` would run, the install stamp taken as made."""
    res = subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "-o", ".venv/.browser",
                          "-o", ".venv/.vulkan", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


# -- one check per README command --------------------------------------------------------------------

def check_make_run(capsys, command):
    recipe = make_recipe("run").strip().splitlines()[-1]
    assert recipe.startswith(".venv/bin/framework run "), recipe
    code, out, err = run_framework(capsys, recipe, "-n", "3", "--ctx", "256")
    assert code == 0 and out.startswith("The capital of France is") and "decode 2 tokens" in err, err


def check_make_test(capsys, command):
    recipe = make_recipe("test")
    assert ".venv/bin/python -m pytest" in recipe                      # the suite itself: not run from inside it
    # the lint, as configured in pyproject.toml, and clean on this checkout
    assert ".venv/bin/python -m ruff check ." in recipe
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def check_make_bench(capsys, command):
    recipe = make_recipe("bench")
    assert "benchmarks/install_llama_cpp.sh" in recipe and ".venv/bin/framework bench" in recipe
    # the framework side, reduced to reservation timing (a full bench measures 1 GiB copies)
    code, out, err = run_framework(capsys, ".venv/bin/framework bench", "-m", "smollm2", "--reservation-only",
                                   "--prompt-tokens", "8")
    assert code == 0 and re.search(r"smollm2\s+decode\s+\d+\s+[\d.]+ / [\d.]+ / [\d.]+", err + out), err + out


def check_make_clean_cache(capsys, command, tmp_path):
    cache, ov = tmp_path / "cache", tmp_path / "ov"
    for folder in (cache / "xdna", ov):
        folder.mkdir(parents=True)
        (folder / "blob").write_bytes(b"x" * 10)
    res = subprocess.run(["make", "clean-cache"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FRAMEWORK_CACHE": str(cache),
                              "FRAMEWORK_OPENVINO_CACHE_DIR": str(ov)})
    assert res.returncode == 0, res.stderr
    assert not cache.exists() and not ov.exists()


def check_run_verify(capsys, command):
    code, out, err = run_framework(capsys, command, "-n", "2", "--ctx", "256")
    assert code == 0 and "verified: 2 fragment runs agree with cpu's on the same inputs" in " ".join(err.split()), err


def check_run_gemma3(capsys, command):
    code, out, err = run_framework(capsys, command, "-n", "2", "--ctx", "256")
    assert code == 0 and out.startswith("Once upon a time") and "gemma3" in err and "placement" in err


def check_run_chat(capsys, command):
    code, out, err = run_framework(capsys, command, "-n", "8", "--ctx", "256")
    assert code == 0 and "base model" not in err and "built-in" not in err      # SmolLM2 has its own template
    # an answer in words, not the turn markup a base model echoes under a template it never saw
    assert len(out.split()) >= 5 and "user" not in out and "<|im_" not in out, out


def check_run_plan(capsys, command):
    code, out, err = run_framework(capsys, command, "-n", "2", "--ctx", "256")
    assert code == 0 and "plans written to plan.json" in err
    record = json.loads(Path("plan.json").read_text())
    assert record["devices"] == ["cpu"] and record["model"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert record["speed"]["decode"]["tokens"] == 1 and record["device_times"]["cpu"]["seconds"] > 0


def check_run_conversation(capsys, command, monkeypatch):
    """Two messages on stdin (a pipe, as `printf 'Hi\\n...' | framework run -cnv`): two replies, one a line."""
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\nWhat is the capital of France?\n"))
    code, out, err = run_framework(capsys, command, "-n", "8", "--ctx", "256")
    assert code == 0 and "placement" in err, err
    assert out.count("\n") >= 2 and "<|im_" not in out and "user" not in out, out


def check_run_prompt_file(capsys, command, monkeypatch):
    import numba
    monkeypatch.chdir(ROOT)                          # the README names a file of the repository
    before = numba.get_num_threads()
    try:
        code, out, err = run_framework(capsys, command, "-n", "2")
        assert code == 0 and numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
    finally:
        numba.set_num_threads(before)
    text = (ROOT / "tests/reference/smollm2_text.txt").read_text(encoding="utf-8")
    assert out.startswith(text.removesuffix("\n")) and "2 tokens generated" in err, err


def check_run_draft(capsys, command):
    code, out, err = run_framework(capsys, command, "-n", "4", "--ctx", "128")
    assert code == 0 and "draft layers:24 (the first 24 of 30 layers of the target)" in err
    assert "speculative: drafted" in err and "draft placement" in err


def check_models(capsys, command):
    code, out, _ = run_framework(capsys, command)
    assert code == 0
    for name in ("smollm2", "gemma3"):
        assert re.search(rf"^{name}\s+(\d+\.\d MiB|assembled from)", out, re.M), out
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in out


def check_backends(capsys, command):
    code, out, _ = run_framework(capsys, command)
    assert code == 0 and re.search(r"^cpu\s+CPU\s+cpu\s+host-cpu\s+available$", out, re.M), out
    assert "device profiles (--device-profile NAME, an EMULATION): xdna, xdna2 on xdna:0" in out


def check_check(capsys, command):
    code, out, _ = run_framework(capsys, command)
    assert code == 0 and "nothing was loaded or compiled" in out and "example:0" in out


def check_check_emulated_npu(capsys, command):
    from framework.registry import default_registry
    if any(d.name == "xdna:0" and d.available for d in default_registry().devices()):
        pytest.skip("xdna:0 is a real NPU here: --device-profile xdna2 applies to it, not to the host arm")
    code, out, err = run_framework(capsys, command)
    assert code == 0, err
    assert "on xdna:0 (EMULATION of xdna2 on the xdna host arm (numpy)), cpu" in out, out
    assert re.search(r"xdna:0: \d+ nodes?, ", out), out


def check_split(capsys, command):
    code, out, err = run_framework(capsys, command, "--prompt-tokens", "8", "-n", "2")
    page = Path("split.html")
    assert code == 0 and "written to split.html" in err and page.stat().st_size > 10_000
    assert '"name":"vulkan:0"' in page.read_text(encoding="utf-8")


def check_check_memory(capsys, command):
    code, out, _ = run_framework(capsys, command, "--prompt-tokens", "8", "-n", "2")
    assert code == 0 and "of 100.0 MiB (capped)" in out, out
    assert re.search(r"^memory fit: vulkan:0 keeps layers 0-\d+ \(", out, re.M) and "memory fit: cpu keeps input" in out


def check_info(capsys, command):
    code, out, _ = run_framework(capsys, command)
    assert code == 0 and "architecture  llama" in out and "chat template yes" in out


def check_perplexity(capsys, command, monkeypatch):
    monkeypatch.chdir(ROOT)                          # the README names a file of the repository
    code, out, _ = run_framework(capsys, command)
    ref = reference("smollm2")[0]
    assert code == 0 and f"over {len(ref['text']['ids'])} tokens" in out
    assert abs(float(out.split()[1]) / ref["text"]["perplexity"] - 1) < 0.01      # llama.cpp's, within 1%


def check_conformance(capsys, command):
    code, _, err = run_framework(capsys, command, "-q", "-p", "no:cacheprovider", "-k", "GET_ROWS")
    assert code == 0 and sys.executable in err          # this interpreter's pytest, not the system's


def check_serve(capsys, command, tmp_path):
    """The server as written, on a free port instead of 8080 (argparse takes the last --port): it gets
    ready, lists its model, and exits 0 on SIGTERM."""
    import http.client
    import os
    import signal
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = shlex.split(command)[1:] + ["--port", str(port), "--ctx", "256"]
    code = "import sys; from framework.cli import main; sys.exit(main(sys.argv[1:]))"
    with (tmp_path / "serve.log").open("w+") as log:
        proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.DEVNULL, stderr=log,
                                env=os.environ.copy())
        try:
            end, body = time.monotonic() + 180, None
            while body is None and time.monotonic() < end and proc.poll() is None:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    conn.request("GET", "/health")
                    health = conn.getresponse()
                    health.read()
                    if health.status == 200:
                        conn.request("GET", "/v1/models")
                        body = json.loads(conn.getresponse().read())
                    else:
                        time.sleep(0.2)
                except OSError:
                    time.sleep(0.2)
            assert body is not None, f"framework serve did not get ready: {log.seek(0) or log.read()}"
            assert [m["id"] for m in body["data"]] == ["smollm2"] and body["data"][0]["parallel"] == 2
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0


def check_settings(capsys, command):
    code, out, _ = run_framework(capsys, command)
    assert code == 0 and "FRAMEWORK_CACHE" in out and "FRAMEWORK_OPENVINO_WEIGHT_BITS" in out


def check_cache(capsys, command):
    code, out, _ = run_framework(capsys, command)
    assert code == 0 and "gguf-index" in out and "MiB in all" in out


COMMANDS = {
    "make run": check_make_run,
    "make test": check_make_test,
    "make bench": check_make_bench,
    "make clean-cache": check_make_clean_cache,
    '.venv/bin/framework run "Once upon a time" -n 64': check_run_gemma3,
    '.venv/bin/framework run -m smollm2 "Why is the sky blue?" --chat': check_run_chat,
    ".venv/bin/framework run -m smollm2 --backends cpu --plan plan.json": check_run_plan,
    ".venv/bin/framework run -m smollm2 -cnv": check_run_conversation,
    ".venv/bin/framework run -m smollm2 -f tests/reference/smollm2_text.txt -n 16 -t 2": check_run_prompt_file,
    ".venv/bin/framework run -m smollm2 --draft layers:24 --draft-n 3 -n 8": check_run_draft,
    ".venv/bin/framework models": check_models,
    ".venv/bin/framework serve -m smollm2 --parallel 2": check_serve,
    ".venv/bin/framework backends": check_backends,
    ".venv/bin/framework check --backends example:0,cpu": check_check,
    ".venv/bin/framework check --backends npu,cpu --device-profile xdna2": check_check_emulated_npu,
    ".venv/bin/framework split --backends vulkan:0,cpu -o split.html": check_split,
    ".venv/bin/framework check -m smollm2 --backends vulkan:0,cpu --device-memory vulkan:0=100M": check_check_memory,
    ".venv/bin/framework info -m smollm2": check_info,
    ".venv/bin/framework perplexity -m smollm2 -f tests/reference/smollm2_text.txt": check_perplexity,
    ".venv/bin/framework conformance --device example:0": check_conformance,
    ".venv/bin/framework run -m smollm2 --backends example:0,cpu --verify": check_run_verify,
    ".venv/bin/framework settings": check_settings,
    ".venv/bin/framework cache": check_cache,
}


def test_every_readme_command_has_a_check_and_every_check_a_command():
    assert sorted(readme_commands()) == sorted(COMMANDS)


def test_the_files_readme_commands_write_are_ignored_by_git():
    """`--plan plan.json`, `-o split.html` run in a checkout leave no untracked file: .gitignore names them."""
    written = [argv[i + 1] for argv in map(shlex.split, readme_commands()) for i, a in enumerate(argv[:-1])
               if a in ("--plan", "--plan-view", "-o", "--output")]
    assert written
    res = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert sorted(res.stdout.split()) == sorted(written), res.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
def test_readme_command_works_as_written(command, capsys, monkeypatch, tmp_path):
    if command not in readme_commands():
        pytest.fail(f"not in README.md any more: {command!r} (update COMMANDS)")
    monkeypatch.chdir(tmp_path)
    check = COMMANDS[command]
    extra = {"tmp_path": tmp_path, "monkeypatch": monkeypatch}
    wanted = check.__code__.co_varnames[2:check.__code__.co_argcount]
    check(capsys, command, **{k: extra[k] for k in wanted})
