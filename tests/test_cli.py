"""The `framework` command: run, info, perplexity, check, and its one-line errors."""

import json

import pytest
from conftest import model_path, reference, reference_text

from framework.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_streams_llama_cpps_greedy_text_and_summarises(capsys, tmp_path):
    ref = reference("smollm2")[0]
    p = ref["prompts"][0]
    plan = tmp_path / "plan.json"
    code, out, err = run_cli(capsys, "run", p["prompt"], "-m", str(model_path("smollm2")), "-n", "6",
                             "--ctx", "256", "--plan", str(plan))
    assert code == 0
    assert out.startswith(p["prompt"] + p["greedy_text"][:8])           # ' Paris.\n\n' and on
    assert "prefill 5 tokens" in err and "decode" in err and "tok/s" in err
    assert "placement" in err and "cpu" in err
    record = json.loads(plan.read_text())
    assert record["devices"] == ["cpu"] and any(k.startswith("decode") for k in record["plans"])


def test_run_chat_uses_the_models_template(capsys):
    code, out, err = run_cli(capsys, "run", "Say hi", "-m", str(model_path("smollm2")), "-n", "4", "--chat",
                             "--ctx", "256")
    assert code == 0 and len(out.strip()) > 0


def test_run_chat_says_when_it_uses_a_built_in_template(capsys):
    code, out, err = run_cli(capsys, "run", "Say hi", "-n", "2", "--chat", "--ctx", "128")
    assert code == 0 and "built-in gemma3 template" in err


def test_info_names_architecture_sizes_types_and_tokenizer(capsys):
    code, out, _ = run_cli(capsys, "info", "-m", "smollm2")
    assert code == 0
    for part in ("architecture  llama", "layers        30", "9 heads, 3 kv heads", "Q4_1", "gpt2 (pre: smollm)",
                 "49152 tokens"):
        assert part in out, part


def test_perplexity_command_matches_llama_cpp(capsys, tmp_path):
    ref = reference("smollm2")[0]
    text = tmp_path / "text.txt"
    text.write_bytes(reference_text(ref).encode("utf-8"))
    code, out, _ = run_cli(capsys, "perplexity", "-m", str(model_path("smollm2")), "-f", str(text), "--ctx", "1024")
    assert code == 0
    value = float(out.split()[1])
    assert abs(value / ref["text"]["perplexity"] - 1) < 0.01
    assert f"over {len(ref['text']['ids'])} tokens" in out


@pytest.mark.parametrize("argv, expect", [
    (["run", "-m", "/no/such/model.gguf", "-n", "1"], "model file not found: /no/such/model.gguf"),
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
