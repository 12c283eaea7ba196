"""The ray plugin on a real Ray cluster of two nodes on this machine (loopback only; docs/distributed.md).

``ray.cluster_utils.Cluster`` starts two raylets, each with its own custom resource (``framework:n1``,
``framework:n2``); the plugin lists their framework installations' devices as ``ray:n1/cpu`` and
``ray:n2/cpu``. The tiny models are split pipeline-wise (a memory cap on n1 keeps the input and the first half
of the layers there; the rest goes to n2) and must give what one process gives, within llama.cpp's bounds.
Faults are real: a node's agent stopped (SIGSTOP) or killed with its raylet.

One cluster for the module (it takes about 15 s to start); the test that kills a node runs last. The cluster is
shut down at the end and no raylet of it may be left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

# a cluster on loopback only: Ray would otherwise put its nodes on this machine's network address (read when
# ray is imported; the raylets started here inherit it)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray
import tiny_models
from conftest import MODELS, REF_DIR, load_model, reference
from ray.cluster_utils import Cluster

from framework.conformance.cases import nmse
from framework.contract import CONTRACT_VERSION
from framework.registry import BLOCK_ENV, default_registry
from framework.core.scheduler.errors import DeviceRunError, DeviceSelectionError
from framework.model.model import Model
from framework.plugins.ray.wire import signature
from framework.runtime.session import Session

NODE_MEMORY = {"object_store_memory": 80 << 20, "include_dashboard": False}
ARCHS = ("llama", "qwen3")          # Llama 3 and Qwen3 (QK norm, untied output): both kinds of layer stack
NMSE_MATMUL = 5e-4                  # llama.cpp's bound (tests/test_tiny_models.py)
TIMEOUT = 6.0                       # FRAMEWORK_RAY_TIMEOUT for the fault tests


def _raylets(session_dir: str) -> list[str]:
    ps = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if "raylet" in line and session_dir in line]


@pytest.fixture(scope="module")
def cluster():
    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "FRAMEWORK_RAY_PLUGINS", BLOCK_ENV)}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"framework:n1": 1},
                                                      "node_ip_address": "127.0.0.1", **NODE_MEMORY})
    session_dir = c.head_node.get_session_dir_path()
    try:
        c.add_node(num_cpus=1, resources={"framework:n2": 1}, **NODE_MEMORY)
        os.environ["RAY_ADDRESS"] = c.address
        os.environ["FRAMEWORK_RAY_PLUGINS"] = "cpu"          # what the nodes' agents load
        # here: the cpu and ray plugins only (the others are not what this file tests, and cost memory)
        os.environ[BLOCK_ENV] = "cuda,opencl,openvino,vulkan,xdna,example"
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    deadline = time.monotonic() + 10
    while _raylets(session_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _raylets(session_dir), f"raylets left after the cluster's shutdown: {_raylets(session_dir)}"


@pytest.fixture(scope="module")
def registry(cluster):
    return default_registry()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-ray")
    out = {}
    for arch in ARCHS:
        ref = json.loads((REF_DIR / "tiny" / f"{arch}.json").read_text(encoding="utf-8"))
        path = tiny_models.write(arch, d / f"tiny-{arch}.gguf")
        assert tiny_models.digest(path) == ref["file_sha256"]
        out[arch] = (Model(path), ref, dict(np.load(REF_DIR / "tiny" / f"{arch}.npz")))
    return out


def _split_session(model: Model, devices, with_input: bool = True, **kw) -> Session:
    """A session on [n1, n2] with n1 capped so that it keeps the input and the first half of the layers: the
    smallest cap that does (the memory fit's own count of each layer's cost), found by bisection. A real model's
    embedding table is larger than half its layers, so with_input=False asks for the layers alone (the memory
    fit then leaves the input to n2, as llama.cpp leaves it to the host)."""
    half = model.hp.n_layer // 2
    want = ["input", *range(half)] if with_input else list(range(half))
    lo, hi = 1, 1 << 30
    while lo < hi:
        mid = (lo + hi) // 2
        kept = Session(model, devices, memory_caps={devices[0].name: mid}, **kw).fit.kept().get(devices[0].name, [])
        if len([p for p in kept if p != "output"]) >= len(want):
            hi = mid
        else:
            lo = mid + 1
    session = Session(model, devices, memory_caps={devices[0].name: lo}, **kw)
    assert session.fit.kept()[devices[0].name] == want, session.fit.lines()
    return session


def _follow(session: Session, p: dict) -> list[np.ndarray]:
    """The prompt's prefill, then llama.cpp's greedy tokens one decode step each: the logits of every step."""
    session.reset()
    rows = [session.eval(p["ids"])]
    for tok in p["greedy_ids"]:
        rows.append(session.eval([tok]))
    return rows


def test_without_a_cluster_the_ray_device_says_why(monkeypatch):
    """No address, or one where nothing answers: one unavailable device 'ray' with the reason, at once (Ray's
    own connection would wait without end). Runs before the module's cluster is connected."""
    monkeypatch.setenv(BLOCK_ENV, "cpu,cuda,opencl,openvino,vulkan,xdna,example")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (dev,) = default_registry().devices()
    assert dev.name == "ray" and not dev.available and "--ray-address" in dev.unavailable_reason
    with socket.socket() as s:                   # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    t0 = time.monotonic()
    (dev,) = default_registry().devices()
    assert not dev.available and f"nothing answers at 127.0.0.1:{port}" in dev.unavailable_reason, dev.describe()
    assert time.monotonic() - t0 < 10
    assert not ray.is_initialized()


def test_nodes_devices_are_listed_with_their_own_answers(registry):
    ray_devices = {d.name: d for d in registry.devices() if d.name.startswith("ray")}
    assert sorted(ray_devices) == ["ray:n1/cpu", "ray:n2/cpu"], registry.describe_devices()
    n1, n2 = ray_devices["ray:n1/cpu"], ray_devices["ray:n2/cpu"]
    assert n1.available and n2.available
    assert n1.node.host == n2.node.host == "127.0.0.1"           # loopback only
    # one machine, two nodes: the physical ids keep the nodes apart, and neither is this process's host CPU
    cpu = registry.select("cpu")[0]
    assert len({n1.physical_id, n2.physical_id, cpu.physical_id}) == 3
    assert n1.physical_id.endswith("/" + cpu.physical_id)
    assert "node n1" in n1.description and n1.node.info["framework"] and n1.node.info["pid"] != os.getpid()
    # a node's memory is not ours: the local CPU cannot use its buffers in place
    assert not cpu.supports_buffer(n1.buffer_type).ok


def test_reservation_asks_the_nodes_before_any_weight_moves(registry, models):
    model, ref, _ = models["llama"]
    devices = registry.select("ray:n1/cpu,ray:n2/cpu")
    session = _split_session(model, devices, n_ctx=64, n_batch=16)
    before = [d.run_figures()["weights_from_file"] for d in devices]
    reservation = session.reserve(len(ref["prompts"][0]["ids"]), 4)
    # every node's verdict came from the node that would run it, asked once per kind of node (the layers
    # repeat: fewer questions than nodes)
    by_name = {d.name: d for d in devices}
    for plan in reservation.plans.values():
        kinds = set()
        for n in plan.graph.nodes:
            dev = by_name[plan.device_of(n)]
            assert signature(n) in dev._verdicts, n.name
            kinds.add(signature(n))
        assert len(kinds) < len(plan.graph.nodes)
    # ... and no weight has been sent or loaded yet
    assert [d.run_figures()["weights_from_file"] for d in devices] == before
    assert not any(d._loads for d in devices)
    phases = {p.graph.meta["phase"]: p.per_device() for p in reservation.plans.values()}
    assert set(phases["decode"]) == {"ray:n1/cpu", "ray:n2/cpu"}


@pytest.mark.parametrize("arch", ARCHS)
def test_two_nodes_give_what_one_process_gives(registry, models, arch):
    model, ref, arrays = models[arch]
    p = ref["prompts"][0]
    local = _follow(Session(model, registry.select("cpu"), n_ctx=64, n_batch=16), p)
    devices = registry.select("ray:n1/cpu,ray:n2/cpu")
    session = _split_session(model, devices, n_ctx=64, n_batch=16)
    start = [d.run_figures() for d in devices]
    remote = _follow(session, p)
    want = arrays[p["steps_key"]].astype(np.float32)
    for k, (ours, here, theirs) in enumerate(zip(remote, local, want)):
        assert nmse(ours, here) < 1e-9, f"{arch} step {k}: two nodes differ from one process"
        assert nmse(ours, theirs) < NMSE_MATMUL, f"{arch} step {k}: NMSE {nmse(ours, theirs):.2e} vs llama.cpp"
    # pipeline-wise: the first node's fragment runs first, the second's last, in the decode plan
    decode = next(pl for pl, _ in session.plans.values() if pl.graph.meta["phase"] == "decode")
    assert [f.device for f in decode.fragments] == ["ray:n1/cpu", "ray:n2/cpu"]
    # weights came from each node's own copy of the file (same path, sha256 checked), none were shipped
    end = [d.run_figures() for d in devices]
    assert all(e["weight_network_bytes"] == s["weight_network_bytes"] for s, e in zip(start, end))
    assert all(e["weights_from_file"] > s["weights_from_file"] for s, e in zip(start, end))
    # what crossed per token: the hidden state n1 -> n2 (float32 per token), the logits n2 -> here
    tokens = session.prefill.tokens + session.decode.tokens
    crossed = end[1]["crossed"] - start[1]["crossed"]
    assert crossed == tokens * model.hp.n_embd * 4
    received = end[1]["received"] - start[1]["received"]
    assert received == len(remote) * model.hp.n_vocab * 4
    assert end[0]["received"] == start[0]["received"]           # nothing of n1's comes back here
    assert all(e["node_seconds"] > s["node_seconds"] for s, e in zip(start, end))


@pytest.mark.parametrize("name", MODELS)
def test_both_real_models_split_across_two_nodes_give_what_one_process_gives(registry, name):
    """SmolLM2 and Gemma 3 split pipeline-wise over the two nodes: the prompt's prefill and three decode steps of
    llama.cpp's greedy tokens give one process's logits, and the prefill follows llama.cpp's as
    tests/test_reference_cpu.py holds the cpu plugin to it (argmax, correlation above 0.995)."""
    model = load_model(name)
    ref, arrays = reference(name)
    p = ref["prompts"][0]
    short = {**p, "greedy_ids": p["greedy_ids"][:3]}
    local = _follow(Session(model, registry.select("cpu"), n_ctx=64, n_batch=16), short)
    devices = registry.select("ray:n1/cpu,ray:n2/cpu")
    session = _split_session(model, devices, with_input=False, n_ctx=64, n_batch=16)
    remote = _follow(session, short)
    for k, (ours, here) in enumerate(zip(remote, local)):
        assert nmse(ours, here) < 1e-9, f"{name} step {k}: two nodes differ from one process"
    assert int(np.argmax(remote[0])) == p["greedy_ids"][0], name
    assert np.corrcoef(remote[0], arrays[p["last_logits_key"]])[0, 1] > 0.995, name
    decode = next(pl for pl, _ in session.plans.values() if pl.graph.meta["phase"] == "decode")
    assert {f.device for f in decode.fragments} == {"ray:n1/cpu", "ray:n2/cpu"}


def test_weights_a_node_cannot_read_from_its_own_file_are_shipped_once(registry, models):
    """A model whose bytes are in this process's memory (no file a node could open) ships each weight once
    through the object store, and gives the same logits; a node whose file has another sha256 is told so."""
    model, ref, _ = models["llama"]
    devices = registry.select("ray:n1/cpu,ray:n2/cpu")
    why = devices[0].node.call("checking a file", "open_file", str(model.file.path), "0" * 64)
    assert "sha256" in why and str(model.file.path) in why, why
    local = _follow(Session(model, registry.select("cpu"), n_ctx=64, n_batch=16), ref["prompts"][0])
    in_memory = Model(model.file.path)
    in_memory.file.data = np.array(in_memory.file.data)          # read into memory: not a mapped file any more
    session = _split_session(in_memory, devices, n_ctx=64, n_batch=16)
    start = [d.run_figures() for d in devices]
    remote = _follow(session, ref["prompts"][0])                  # a prefill plan and a decode plan
    assert all(nmse(a, b) < 1e-9 for a, b in zip(remote, local))
    for d, s in zip(devices, start):
        shipped = d.run_figures()["weight_network_bytes"] - s["weight_network_bytes"]
        weights = {id(t): t for plan, _ in session.plans.values() for f in plan.fragments if f.device == d.name
                   for t in f.inputs if t.is_leaf and t.kind.value == "weight"}
        assert shipped == sum(t.nbytes for t in weights.values()) > 0, d.name     # each once, over both plans
        assert d.run_figures()["weights_from_file"] == s["weights_from_file"]


def test_run_summary_shows_network_bytes_and_node_time(registry, models):
    from framework.cli.report import placement_rows
    model, ref, _ = models["llama"]
    session = _split_session(model, registry.select("ray:n1/cpu,ray:n2/cpu"), n_ctx=64, n_batch=16)
    _follow(session, ref["prompts"][0])
    _, rows = placement_rows(session)
    notes = {r.cells[0]: r.note for r in rows}
    assert set(notes) == {"ray:n1/cpu", "ray:n2/cpu"}
    for note in notes.values():
        assert "B/token over the network" in note and "computed on its node" in note, note


SHIM = """# the framework distribution of this node is version 9.9.9: its metadata is found first
import importlib.metadata as md, pathlib, sys
class _OtherInstall:
    @classmethod
    def find_spec(cls, *args, **kwargs):
        return None
    @classmethod
    def find_distributions(cls, context=md.DistributionFinder.Context()):
        here = pathlib.Path(__file__).parent / "framework-9.9.9.dist-info"
        return iter([md.PathDistribution(here)] if context.name == "framework" else [])
sys.meta_path.insert(0, _OtherInstall)
"""


def test_framework_run_spans_two_nodes_from_the_command_line(cluster, registry, models, tmp_path, capsys):
    """`framework run --ray-address ... --backends ray:n1/cpu,ray:n2/cpu --device-memory ray:n1/cpu=SIZE`: the
    summary shows each node's network bytes per token and time, and the --plan record keeps them."""
    from framework.cli import main
    model = models["llama"][0]
    cap = _split_session(model, registry.select("ray:n1/cpu,ray:n2/cpu"), n_ctx=64, n_batch=16).budgets["ray:n1/cpu"]
    plan = tmp_path / "plan.json"
    rc = main(["run", "The capital of France is", "-m", str(model.file.path), "--ray-address", cluster.address,
               "--backends", "ray:n1/cpu,ray:n2/cpu", "--device-memory", f"ray:n1/cpu={cap.nbytes}", "-n", "4",
               "--ctx", "64", "--batch", "16", "--plan", str(plan)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "ray:n1/cpu" in err and "ray:n2/cpu" in err and "/token over the network" in err, err
    figures = json.loads(plan.read_text())["device_figures"]
    assert set(figures) == {"ray:n1/cpu", "ray:n2/cpu"}
    assert all(f["network_bytes"] > 0 and f["node_seconds"] > 0 and f["tokens"] > 0 for f in figures.values())


def test_a_cluster_on_loopback_alone_is_named_without_the_loopback_setting():
    """A head in Ray's loopback mode listens on 127.0.0.1 alone, and a process without
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 would connect to this machine's network address and wait without end:
    the plugin says which setting is missing (a process of its own: Ray reads the setting when imported)."""
    code = ("import socket\n"
            "import ray.util\n"
            "from framework.plugins.ray.cluster import unreachable\n"
            "s = socket.socket()\n"
            "s.bind(('127.0.0.1', 0))\n"
            "s.listen()\n"
            "print(ray.util.get_node_ip_address())\n"
            "print(unreachable(f'127.0.0.1:{s.getsockname()[1]}'))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    there, why = run.stdout.splitlines()
    if there.startswith("127."):
        pytest.skip("this machine has no network address: Ray keeps loopback addresses here")
    assert "answers on loopback only" in why and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in why, why


DOCS = Path(__file__).resolve().parents[1] / "docs" / "distributed.md"


def _docs_one_machine_recipe() -> list[list[str]]:
    """The commands of docs/distributed.md's "On one machine" block, one list of words each."""
    text = DOCS.read_text(encoding="utf-8").split("On one machine, to try it", 1)[1]
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def _end_processes_of(temp: str) -> list[str]:
    """End the Ray processes of one session (those whose command line names its folder, and their children),
    as `ray stop` would end every Ray process of the user; the command lines of any left."""
    def listed() -> list[tuple[int, int, str]]:
        ps = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
        return [(int(p), int(pp), a) for p, pp, a in (line.split(None, 2) for line in ps.splitlines()
                                                        if len(line.split(None, 2)) == 3)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        rows = listed()
        ours = {p for p, _, a in rows if temp in a}
        ours |= {p for p, pp, _ in rows if pp in ours}
        for pid in ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while any(temp in a for _, _, a in listed()) and time.monotonic() < deadline:
            time.sleep(0.2)
    return [a for _, _, a in listed() if temp in a]


def test_the_docs_one_machine_recipe_works_as_written(tmp_path):
    """docs/distributed.md's commands for two nodes on one machine, as written (Ray's loopback mode, which the
    docs once asked for, makes `ray start` refuse the second node): only a free port for 6379, a temporary
    folder, one CPU and a small object store per node, the tiny model and 4 tokens are added, and the session's
    processes are ended instead of `ray stop` (which ends every Ray process of the user). The run's standard
    output is exactly the one-process run's: Ray writes nothing into it."""
    head, node, backends, run, stop = _docs_one_machine_recipe()
    assert [c[:2] for c in (head, node, backends, run, stop)] == [
        ["ray", "start"], ["ray", "start"], ["framework", "backends"], ["framework", "run"], ["ray", "stop"]]
    with socket.socket() as s:
        s.bind(("", 0))
        port = str(s.getsockname()[1])
    temp = tempfile.mkdtemp(prefix="ray-docs-", dir="/tmp")      # short: Ray's socket paths have a length limit
    model = str(tiny_models.write("llama", tmp_path / "tiny-llama.gguf"))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    env.update({"FRAMEWORK_RAY_PLUGINS": "cpu", BLOCK_ENV: "cuda,opencl,openvino,vulkan,xdna,example"})
    ray_bin = str(Path(sys.executable).with_name("ray"))
    small = ["--num-cpus", "1", "--object-store-memory", str(80 << 20)]

    def command(words: list[str], *more: str) -> subprocess.CompletedProcess:
        words = [w.replace("6379", port) for w in words]
        exe = [ray_bin] if words[0] == "ray" else [sys.executable, "-m", "framework"]
        return subprocess.run([*exe, *words[1:], *more], env=env, capture_output=True, text=True, timeout=300)

    try:
        for words, more in ((head, ["--temp-dir", temp, "--include-dashboard", "false", *small]), (node, small)):
            started = command(words, *more)
            assert started.returncode == 0 and "PANIC" not in started.stderr + started.stdout, started.stderr
        listed = command(backends)
        assert listed.returncode == 0, listed.stderr
        for name in ("ray:n1/cpu", "ray:n2/cpu"):
            assert f"{name} " in listed.stdout and "unavailable" not in listed.stdout.split(name, 1)[1].split("\n")[0]
        remote = command(run, "-m", model, "-n", "4")
        assert remote.returncode == 0 and "ray:n1/cpu" in remote.stderr, remote.stderr
    finally:
        left = _end_processes_of(temp)
        shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"Ray processes left: {left}"
    local = command(["framework", "run", run[-1], "-m", model, "-n", "4", "--backends", "cpu"])
    assert local.returncode == 0, local.stderr
    assert remote.stdout == local.stdout and remote.stdout.startswith(run[-1])


def test_a_node_with_another_framework_version_is_refused_naming_both(cluster, tmp_path):
    """A third node whose framework installation reports another version (its workers find a framework 9.9.9
    distribution's metadata first, through a sitecustomize on their PYTHONPATH, as a node with another install
    would): its devices are unavailable, and selecting one fails before planning, naming both versions."""
    shim = tmp_path / "site"
    (shim / "framework-9.9.9.dist-info").mkdir(parents=True)
    (shim / "framework-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: framework\n"
                                                                 "Version: 9.9.9\n")
    (shim / "sitecustomize.py").write_text(SHIM)
    node = cluster.add_node(num_cpus=0, resources={"framework:old": 1},
                            env_vars={"PYTHONPATH": str(shim)}, **NODE_MEMORY)
    try:
        registry = default_registry()
        old = [d for d in registry.devices() if d.name.startswith("ray:old")]
        assert old and not any(d.available for d in old)
        with pytest.raises(DeviceSelectionError) as err:
            registry.select(old[0].name)
        text = str(err.value)
        here = version("framework")
        assert here != "9.9.9" and "framework 9.9.9" in text and f"framework {here}" in text, text
        assert "node old" in text, text
        assert {d.name for d in registry.devices() if d.available and d.name.startswith("ray")} == \
            {"ray:n1/cpu", "ray:n2/cpu"}
    finally:
        cluster.remove_node(node)


def test_a_node_with_another_contract_version_is_refused_naming_both(cluster, tmp_path):
    """A node whose framework (same version) implements another plugin contract, as an installation patched
    or built from another commit would (its workers' sitecustomize raises CONTRACT_VERSION): its devices are
    unavailable with both contract versions named, and the other nodes stay usable."""
    shim = tmp_path / "site"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import framework.contract as c\nc.CONTRACT_VERSION += 1\n")
    node = cluster.add_node(num_cpus=0, resources={"framework:newer": 1},
                            env_vars={"PYTHONPATH": str(shim)}, **NODE_MEMORY)
    try:
        registry = default_registry()
        newer = [d for d in registry.devices() if d.name.startswith("ray:newer")]
        assert newer and not any(d.available for d in newer)
        text = newer[0].unavailable_reason
        here = version("framework")
        assert f"framework {here} (contract {CONTRACT_VERSION + 1})" in text, text
        assert f"this process framework {here} (contract {CONTRACT_VERSION})" in text, text
        with pytest.raises(DeviceSelectionError):
            registry.select(newer[0].name)
        assert {d.name for d in registry.devices() if d.available and d.name.startswith("ray")} == \
            {"ray:n1/cpu", "ray:n2/cpu"}
    finally:
        cluster.remove_node(node)


def test_a_node_that_stops_answering_gives_a_named_error_within_the_timeout(registry, models, monkeypatch):
    model, ref, _ = models["llama"]
    devices = registry.select("ray:n1/cpu,ray:n2/cpu")
    session = _split_session(model, devices, n_ctx=64, n_batch=16)
    ids = ref["prompts"][0]["ids"]
    session.eval(ids)
    monkeypatch.setenv("FRAMEWORK_RAY_TIMEOUT", str(TIMEOUT))
    pid = devices[1].node.info["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(DeviceRunError) as err:
            session.eval([ref["prompts"][0]["greedy_ids"][0]])
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    text = str(err.value)
    assert "ray:n2/cpu" in text and "node n2" in text and "fragment" in text and "did not answer" in text, text
    assert took < TIMEOUT + 3, f"the error came after {took:.1f} s, the timeout is {TIMEOUT} s"


def test_a_killed_node_gives_a_named_error_within_the_timeout(cluster, registry, models, monkeypatch):
    """Runs last: n2 is killed (its raylet and its agent's process, as when a machine goes down)."""
    model, ref, _ = models["llama"]
    devices = registry.select("ray:n1/cpu,ray:n2/cpu")
    session = _split_session(model, devices, n_ctx=64, n_batch=16)
    session.eval(ref["prompts"][0]["ids"])
    monkeypatch.setenv("FRAMEWORK_RAY_TIMEOUT", str(TIMEOUT))
    n2 = next(n for n in cluster.worker_nodes)
    cluster.remove_node(n2, allow_graceful=False)
    try:
        os.kill(devices[1].node.info["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass                     # gone with its raylet already
    t0 = time.monotonic()
    with pytest.raises(DeviceRunError) as err:
        session.eval([ref["prompts"][0]["greedy_ids"][0]])
    took = time.monotonic() - t0
    text = str(err.value)
    assert "ray:n2/cpu" in text and "node n2" in text and "fragment" in text, text
    assert took < TIMEOUT + 3, f"the error came after {took:.1f} s, the timeout is {TIMEOUT} s"
