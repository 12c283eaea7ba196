"""--verify: a plugin whose kernel is slightly wrong but finite (tests/buggy_plugin.py's q8-scale: a Q8_0
product with every other block's scale 1/4 too large) runs unnoticed without it, and is stopped with it,
naming the node, the device, the plugin and the fix; a correct plugin and the cpu plugin pass, against the
cpu plugin and against the graph's reference interpreter; --verify-every samples the steps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import load_model, model_path
from test_contract import PROMPT, assert_names, registered, session

import buggy_plugin
from framework.core.graph import ops
from framework.core.scheduler import DeviceRunError
from framework.core.scheduler.verify import ReferenceDevice, Verifier
from framework.plugins.cpu.device import CpuDevice


def verifier(reference=None, every: int = 1) -> Verifier:
    return Verifier(reference or CpuDevice(), load_model("smollm2").weight_bytes, every)


def test_the_scale_error_is_real_and_passes_unnoticed_without_verify():
    _, devices = registered("q8-scale")
    logits = session(devices).eval(PROMPT)
    ref = session([CpuDevice()]).eval(PROMPT)
    assert np.isfinite(logits).all()
    err = ops.nmse(logits, ref)
    assert ops.nmse_threshold("MUL_MAT") < err < 0.1, err      # wrong beyond ggml's threshold, yet plausible


def test_verify_stops_the_scale_error_naming_node_device_plugin_and_fix():
    _, devices = registered("q8-scale")
    check = verifier()
    with pytest.raises(DeviceRunError) as info:
        session(devices, verifier=check).eval(PROMPT)
    e = info.value
    assert (e.device, e.plugin, e.node) == ("buggy:0", "buggy (buggy-plugin 0.1)", "result_output")
    assert_names(" ".join(str(e).split()), "device buggy:0 (plugin buggy (buggy-plugin 0.1))",
                 "node 'result_output' (MUL_MAT", "differ from cpu's on the same inputs", "over the threshold 5.0e-04",
                 "fix: a kernel of BuggyDevice", "framework conformance --device buggy:0")
    assert check.checked == 1


@pytest.mark.parametrize("reference", [CpuDevice, ReferenceDevice])
def test_a_correct_plugin_passes_against_cpu_and_the_reference_interpreter(reference):
    _, devices = registered("none", take="^(ffn_|result_output)")
    check = verifier(reference())
    s = session(devices, verifier=check)
    s.eval(PROMPT)
    s.eval([504])
    assert check.checked > 2 and check.steps == 2
    share, node = check.closest               # how near the nearest output came to its threshold, and which
    assert 0 <= share < 1 and node


def test_the_cpu_plugins_q8_path_passes_against_the_reference_interpreter():
    """One fragment of two whole layers: the q8 rounding of some 10 products in a chain is within the sum of
    their thresholds (a single product's would not hold it)."""
    cpu = CpuDevice("q8")
    if not cpu.available:
        pytest.skip(cpu.unavailable_reason)
    check = verifier(ReferenceDevice())
    s = session([cpu], verifier=check)
    s.eval(PROMPT)
    assert check.checked == 1


def test_verify_every_samples_the_steps():
    _, devices = registered("none", take="^result_output$")
    check = verifier(every=2)
    s = session(devices, verifier=check)
    s.eval(PROMPT)
    for token in (504, 3458, 282):
        s.eval([token])
    assert (check.steps, check.checked) == (4, 2)
    with pytest.raises(ValueError, match="--verify-every"):
        verifier(every=0)


@pytest.fixture(scope="module")
def buggy_env(tmp_path_factory) -> dict:
    """The environment of a process where buggy_plugin is an installed distribution making the q8-scale
    mistake on the output product."""
    site = tmp_path_factory.mktemp("site")
    (site / "buggy_plugin.py").write_text(Path(buggy_plugin.__file__).read_text())
    dist = site / "buggy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: buggy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[framework.backends]\nbuggy = buggy_plugin\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
            "FRAMEWORK_BUGGY": "q8-scale", "FRAMEWORK_BUGGY_TAKE": "^result_output$"}


CLI = [sys.executable, "-m", "framework.cli.main"]
BUGGY_NAMES = ("device buggy:0 (plugin buggy (buggy-plugin 0.1))", "node 'result_output' (MUL_MAT", "NMSE", "fix:")


def test_run_exits_3_with_verify_and_runs_without(buggy_env):
    cmd = CLI + ["run", "Hello", "-n", "2", "-m", str(model_path("smollm2")), "--backends", "buggy:0,cpu",
                 "--ctx", "64"]
    plain = subprocess.run(cmd, env=buggy_env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    verified = subprocess.run(cmd + ["--verify"], env=buggy_env, capture_output=True, text=True, timeout=300)
    assert verified.returncode == 3, verified.stderr
    assert_names(" ".join(verified.stderr.split()), *BUGGY_NAMES)
    assert "Traceback" not in verified.stderr


def test_check_verify_runs_the_reserved_steps_and_exits_3(buggy_env):
    cmd = CLI + ["check", "-m", str(model_path("smollm2")), "--backends", "buggy:0,cpu", "--ctx", "64",
                 "--prompt-tokens", "4", "-n", "8", "--verify"]
    res = subprocess.run(cmd, env=buggy_env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 3, res.stdout + res.stderr
    assert_names(" ".join(res.stderr.split()), *BUGGY_NAMES)
    ok = subprocess.run(cmd, env={**buggy_env, "FRAMEWORK_BUGGY": "none"}, capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert_names(" ".join(ok.stdout.split()), "prefill of 4 tokens", "verified: 2 fragment runs agree with cpu's")


def test_serve_answers_500_naming_the_node_on_a_verified_step(buggy_env):
    from test_serve import KEY, Server, _free_port
    port = _free_port()
    cmd = CLI + ["serve", "-m", "smollm2", "--backends", "buggy:0,cpu", "--ctx", "64",
                 "--port", str(port), "--api-key", KEY, "--verify", "--verify-every", "1"]
    with open(os.devnull, "w") as quiet:
        srv = Server(port, subprocess.Popen(cmd, env=buggy_env, stdout=quiet, stderr=subprocess.PIPE, text=True), None)
        try:
            for _ in range(900):
                try:
                    if srv.raw("GET", "/health")[0] == 200:
                        break
                except OSError:
                    pass
                assert srv.proc.poll() is None, srv.proc.stderr.read()
                time.sleep(0.2)
            status, _, body = srv.raw("POST", "/v1/completions", {"model": "smollm2", "prompt": "Hello",
                                                                   "max_tokens": 2, "temperature": 0})
        finally:
            srv.proc.send_signal(signal.SIGTERM)
            log = srv.proc.communicate(timeout=60)[1]
    assert status == 500, body
    assert_names(" ".join(body["error"]["message"].split()), *BUGGY_NAMES)
    assert "verifying one step in 1 against cpu (--verify)" in log


def test_a_reference_that_fails_is_named_as_the_reference_not_the_checked_device():
    class BrokenReference(ReferenceDevice):
        name = "broken"

        def compile(self, fragment):
            raise RuntimeError("no kernel for this fragment")

    _, devices = registered("none", take="^result_output$")
    with pytest.raises(DeviceRunError) as info:
        session(devices, verifier=verifier(BrokenReference())).eval(PROMPT)
    assert info.value.device == "broken"
    assert_names(" ".join(str(info.value).split()), "--verify's reference device broken", "no kernel for this fragment",
                 "fix: verify against another device (--verify reference")
