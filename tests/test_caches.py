"""On-disk caches (GGUF index, OpenVINO compiled models, XDNA packed weights, numba's kernels, PoCL's
programs): written atomically, checked when read, a corrupt, truncated or foreign entry reported and rebuilt
(never used), two processes filling one cache at once, a read-only folder reported once, and `framework
cache` showing and clearing them."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from test_model_file import LLAMA_KV, llama_tensors, write_gguf

from framework import caches, settings
from framework.cli import main
from framework.core.graph import F32, GraphBuilder, LeafKind, leaf
from framework.core.scheduler import Executor, make_plan
from framework.model.gguf_file import open_model_file
from framework.model.model import Model

Q = GGMLQuantizationType


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("FRAMEWORK_CACHE", str(root))
    monkeypatch.delenv("FRAMEWORK_OPENVINO_CACHE_DIR", raising=False)
    monkeypatch.delenv("FRAMEWORK_XDNA_CACHE_DIR", raising=False)
    caches._REPORTED.clear()
    return root


@pytest.fixture
def tiny(tmp_path):
    return write_gguf(tmp_path / "tiny.gguf", "llama", llama_tensors(), LLAMA_KV)


def _index(cache: Path) -> Path:
    (entry,) = (cache / "gguf-index").glob("*.json")
    return entry


# -- the GGUF index -------------------------------------------------------------------------------------
def test_index_is_json_with_a_digest_and_not_code(cache, tiny):
    first = Model(tiny).hp
    entry = _index(cache)
    head, body = entry.read_text().split("\n", 1)
    meta = json.loads(head)
    assert meta["format"] == "framework-gguf-index" and meta["digest"] == caches.digest_bytes(body.encode())
    assert json.loads(body)["metadata"]["llama.block_count"] == 2
    assert not list((cache / "gguf-index").glob("*.pkl"))
    assert Model(tiny).hp == first                                   # read back from the index


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "pickle"])
def test_a_bad_index_entry_is_reported_and_rebuilt(cache, tiny, tmp_path, capfd, damage):
    Model(tiny)
    entry = _index(cache)
    data = bytearray(entry.read_bytes())
    if damage == "flip":            # the rope base, or a token, changed inside the cached text
        i = data.index(b'"llama.block_count":2')
        data[i + len('"llama.block_count":')] = ord("7")
    elif damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "foreign":       # another file's index under this file's key
        other = write_gguf(tmp_path / "other.gguf", "llama", llama_tensors(), {**LLAMA_KV, "llama.context_length": 64})
        Model(other)
        data = bytearray(next(p for p in (cache / "gguf-index").glob("*.json") if p != entry).read_bytes())
    else:                           # what an attacker who can write the folder would plant
        import pickle
        data = bytearray(pickle.dumps({"metadata": {}}))
    entry.write_bytes(bytes(data))
    capfd.readouterr()
    model = Model(tiny)
    assert model.hp.n_layer == 2 and model.hp.n_ctx_train == 128
    err = capfd.readouterr().err
    assert f"GGUF index {entry}" in err and "rebuilt" in err
    Model(tiny)
    assert "rebuilt" not in capfd.readouterr().err                    # the rebuilt entry is good


def test_a_read_only_index_folder_is_reported_once_and_the_run_goes_on(cache, tiny, tmp_path, capfd):
    cache.mkdir()
    (cache / "gguf-index").write_text("a file where the folder should be")
    for _ in range(2):
        assert Model(tiny).hp.n_layer == 2
    err = capfd.readouterr().err
    assert err.count("cannot be written") == 1 and "uncached" in err


def test_empty_framework_cache_does_not_write_into_the_current_folder(tmp_path, tiny, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("FRAMEWORK_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.cache_root() == tmp_path / "xdg" / "framework"
    open_model_file(tiny)
    assert list(work.iterdir()) == []
    assert list((tmp_path / "xdg" / "framework" / "gguf-index").glob("*.json"))
    monkeypatch.setenv("FRAMEWORK_CACHE", "off")
    assert settings.cache_root() is None and settings.cache_dir("gguf-index") is None


def _open_many(path: str, n: int) -> int:
    for _ in range(n):
        open_model_file(path)
    return len(open_model_file(path).tensors)


def test_two_processes_filling_one_index_do_not_corrupt_it(cache, tiny, tmp_path):
    files = [write_gguf(tmp_path / f"m{i}.gguf", "llama", llama_tensors(), LLAMA_KV) for i in range(4)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        counts = pool.starmap(_open_many, [(str(f), 3) for f in files for _ in range(2)])
    assert set(counts) == {len(llama_tensors())}
    entries = list((cache / "gguf-index").glob("*.json"))
    assert len(entries) == 4 and not list((cache / "gguf-index").glob(".*.tmp"))
    for e in entries:
        head, body = e.read_text().split("\n", 1)
        assert json.loads(head)["digest"] == caches.digest_bytes(body.encode())


# -- OpenVINO's compiled models ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ov_cpu(registry):
    (dev,) = registry.select("openvino:CPU")
    return dev


def _ov_matmul(dev):
    """A quantized matrix product on dev: (output, device stats)."""
    from gguf import quants
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    raw = np.ascontiguousarray(quants.quantize(w, Q.Q8_0)).view(np.uint8).reshape(-1)
    tw = leaf("blk.0.ffn_up.weight", Q.Q8_0, (64, 256), LeafKind.WEIGHT)
    b = GraphBuilder()
    tx = b.input("x", F32, (2, 256))
    graph = b.build([b.mul_mat(b.use(tw), tx)])
    x = rng.standard_normal((2, 256)).astype(np.float32)
    (out,) = Executor([dev], lambda t: raw).run(make_plan(graph, [dev]), {id(tx): x})
    return np.asarray(out).copy()


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_bad_openvino_blob_is_deleted_and_recompiled(cache, ov_cpu, tmp_path, capfd, damage):
    folder = tmp_path / "ov"
    first = ov_cpu.with_options(cache_dir=folder)
    want = _ov_matmul(first)
    (blob,) = folder.glob("*.blob")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["blobs"][blob.name] == {"size": blob.stat().st_size, "digest": caches.digest_file(blob)}
    again = ov_cpu.with_options(cache_dir=folder)
    np.testing.assert_array_equal(_ov_matmul(again), want)
    assert (again.stats.compiled, again.stats.from_cache) == (0, 1)           # a good blob is imported
    data = bytearray(blob.read_bytes())
    if damage == "flip":            # 64 bytes flipped in the middle: the size is unchanged
        mid = len(data) // 2
        data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
        blob.write_bytes(bytes(data))
    elif damage == "truncate":      # a write cut short
        blob.write_bytes(bytes(data[:223]))
    else:                           # a blob the manifest never recorded
        (folder / "f00d.blob").write_bytes(bytes(data))
        blob.unlink()
        blob = folder / "f00d.blob"
    capfd.readouterr()
    third = ov_cpu.with_options(cache_dir=folder)
    np.testing.assert_array_equal(_ov_matmul(third), want)
    assert third.stats.compiled == 1 and third.stats.from_cache == 0
    err = capfd.readouterr().err
    assert f"OpenVINO cache blob {blob}" in err and "deleted" in err
    assert not (damage == "foreign" and blob.exists())


def _ov_in_a_process(folder: str) -> tuple[list, int, int]:
    from framework.registry import default_registry
    (dev,) = default_registry().select("openvino:CPU")
    dev = dev.with_options(cache_dir=Path(folder))
    out = _ov_matmul(dev)
    return out.tolist(), dev.stats.compiled, dev.stats.from_cache


def test_two_processes_filling_one_openvino_cache_do_not_corrupt_it(cache, ov_cpu, tmp_path, capfd):
    folder = tmp_path / "ov"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.map(_ov_in_a_process, [str(folder)] * 2)
    assert results[0][0] == results[1][0]
    assert sorted(r[1] for r in results) in ([0, 1], [1, 1])           # the lock: one compiles, or each does
    manifest = json.loads((folder / "manifest.json").read_text())
    blobs = list(folder.glob("*.blob"))
    assert blobs and {b.name for b in blobs} == set(manifest["blobs"])
    capfd.readouterr()
    dev = ov_cpu.with_options(cache_dir=folder)
    np.testing.assert_array_equal(_ov_matmul(dev), np.array(results[0][0], dtype=np.float32))
    assert (dev.stats.compiled, dev.stats.from_cache) == (0, 1) and "deleted" not in capfd.readouterr().err


def test_a_read_only_openvino_cache_folder_is_reported_once(cache, ov_cpu, tmp_path, capfd):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    dev = ov_cpu.with_options(cache_dir=blocker / "ov")
    for _ in range(2):
        _ov_matmul(dev)
    err = capfd.readouterr().err
    assert err.count("cannot be written") == 1 and "without an on-disk cache" in err
    assert dev.compiling.cache_dir is None and "the on-disk cache is off" in dev.compile_summary()
    assert "cannot be written" in dev.compile_summary()


# -- XDNA's packed weights --------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_xdna_packed_tiles_are_reported_and_repacked(cache, tmp_path, capfd, damage):
    from test_xdna import matmul_graph, q_weight, run_graph

    from framework.plugins.xdna.cache import model_key
    from framework.plugins.xdna.device import host_arm_device
    w, raw = q_weight("blk.0.attn_q.weight", (96, 512))
    graph, xl = matmul_graph([w], 2, 512)
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    want = run_graph([host_arm_device(0, cache_root=tmp_path)], graph, xl, x, {w.name: raw})[1][0]
    packed = tmp_path / model_key(raw) / "packed.bin"
    _damage(packed, damage)
    dev = host_arm_device(0, cache_root=tmp_path)
    np.testing.assert_array_equal(run_graph([dev], graph, xl, x, {w.name: raw})[1][0], want)
    (why,) = dev.store.stats.rebuilt
    assert "'blk.0.attn_q.weight'" in why and dev.store.stats.packed == 1
    assert ("digest" if damage == "flip" else "truncated") in why, why
    assert "repacked" in capfd.readouterr().err


# -- caches a library reads by itself: numba's kernels, PoCL's programs -----------------------------------
def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":               # a write cut short
        path.write_bytes(bytes(data[:len(data) // 2]))
    else:                               # 64 bytes flipped in the middle: the size is unchanged
        mid = len(data) // 2
        data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
        path.write_bytes(bytes(data))


def _child(code: str, cache: Path) -> subprocess.CompletedProcess:
    """A process of its own: numba loads a kernel once a process, and PoCL aborts the whole process on a
    bad program."""
    env = {**os.environ, "FRAMEWORK_CACHE": str(cache)}
    for name in ("NUMBA_CACHE_DIR", "POCL_CACHE_DIR", "POCL_KERNEL_CACHE"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def _fill_once(tmp_path_factory, name: str, code: str) -> Path:
    cache = tmp_path_factory.mktemp(name) / "cache"
    run = _child(code, cache)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    return cache


NUMBA_RUN = ("import numpy as np\n"
             "from framework.plugins.cpu.norm import rms_norm\n"
             "out = rms_norm(np.full((2, 64), 2.0, np.float32), eps=0.0)\n"
             "print('ok' if np.allclose(out, 1.0) else out)\n")

OPENCL_RUN = ("import numpy as np\n"
              "from framework.core.graph import F32, GraphBuilder\n"
              "from framework.core.scheduler import Executor, make_plan\n"
              "from framework.plugins.opencl.device import devices\n"
              "(dev,) = devices()[:1]\n"
              "b = GraphBuilder()\n"
              "x = b.input('x', F32, (2, 64))\n"
              "graph = b.build([b.rms_norm(x, 0.0)])\n"
              "plan = make_plan(graph, [dev])\n"
              "assert {f.device for f in plan.fragments} == {dev.name}, plan.fragments\n"
              "(out,) = Executor([dev], lambda t: None).run(plan, {id(x): np.full((2, 64), 2.0, np.float32)})\n"
              "print('ok' if np.allclose(np.asarray(out), 1.0, atol=1e-5) else out)\n")


@pytest.fixture(scope="module")
def numba_filled(tmp_path_factory) -> Path:
    return _fill_once(tmp_path_factory, "numba", NUMBA_RUN)


@pytest.fixture(scope="module")
def opencl_filled(tmp_path_factory) -> Path:
    return _fill_once(tmp_path_factory, "opencl", OPENCL_RUN)


def _manifest_lists_every_file(folder: Path) -> None:
    listed = json.loads((folder / "manifest.json").read_text())["files"]
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*")
               if p.is_file() and p.name != "manifest.json" and not p.name.startswith(".")}
    assert listed and set(listed) == on_disk


@pytest.mark.parametrize("pattern, damage", [("*.nbi", "truncate"), ("*.nbc", "flip"), ("*.nbi", "flip")])
def test_a_bad_numba_kernel_file_is_deleted_and_compiled_again(numba_filled, tmp_path, pattern, damage):
    """numba loads its index and kernels as pickles: a damaged one used to fail every later cpu run with
    UnpicklingError, blamed on the device."""
    cache = tmp_path / "cache"
    shutil.copytree(numba_filled, cache)
    (folder,) = (cache / "numba").iterdir()
    _manifest_lists_every_file(folder)
    (bad,) = folder.rglob(pattern)
    _damage(bad, damage)
    run = _child(NUMBA_RUN, cache)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    assert f"cache: numba kernel cache file {bad}" in run.stderr
    assert "deleted, the kernel is compiled again" in run.stderr
    _manifest_lists_every_file(folder)                                  # the rebuilt file is recorded
    again = _child(NUMBA_RUN, cache)
    assert again.returncode == 0 and "deleted" not in again.stderr, again.stderr


@pytest.mark.parametrize("pattern, damage", [("program.bc", "truncate"), ("program.bc", "flip"), ("*.so", "truncate")])
def test_a_bad_pocl_program_is_deleted_and_built_again(opencl_filled, tmp_path, pattern, damage):
    """PoCL reads its cache without checking it: a damaged program aborted every later run (SIGABRT,
    pocl_llvm_build.cc: Assertion 'program->data[device_i]' failed), a truncated kernel library crashed it
    (SIGBUS). So the run is a process of its own here."""
    cache = tmp_path / "cache"
    shutil.copytree(opencl_filled, cache)
    folder = cache / "opencl"
    _manifest_lists_every_file(folder)
    (bad,) = (folder / "pocl").rglob(pattern)
    _damage(bad, damage)
    run = _child(OPENCL_RUN, cache)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr)
    assert f"cache: OpenCL kernel cache file {bad}" in run.stderr
    assert "deleted, the kernel is built again" in run.stderr
    _manifest_lists_every_file(folder)


def test_a_library_cache_without_a_manifest_is_emptied_in_one_line(tmp_path, capfd):
    """A folder filled before it had a manifest (or by hand): one line for the folder, not one a file."""
    folder = tmp_path / "lib"
    (folder / "sub").mkdir(parents=True)
    for i in range(5):
        (folder / "sub" / f"k{i}.bin").write_bytes(bytes([i]) * 100)
    manifest = caches.Manifest(folder, "test cache file", "built again")
    assert manifest.check() == {}
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and f"test cache files in {folder} have no manifest" in err and "5 deleted" in err
    assert not list(folder.rglob("*.bin"))
    (folder / "sub" / "k.bin").write_bytes(b"kernel")
    manifest.record({})
    assert caches.Manifest(folder, "test cache file", "built again").check() == {
        "sub/k.bin": {"size": 6, "digest": caches.digest_bytes(b"kernel")}}
    assert capfd.readouterr().err == ""


def _run_line(run: subprocess.CompletedProcess) -> tuple[float, float]:
    """(seconds of prefill, seconds of compiling) from the run's summary: tokens / tok/s, and the compile line."""
    import re
    pre = re.search(r"^prefill (\d+) tokens? at ([\d.]+) tok/s", run.stderr, re.M)
    compiled = re.search(r"^compiling kernels ([\d.]+) s, left out of the speeds above$", run.stderr, re.M)
    assert pre, run.stderr
    return int(pre[1]) / float(pre[2]), float(compiled[1]) if compiled else 0.0


def test_a_first_run_says_it_compiles_and_keeps_that_out_of_prefill(tmp_path):
    """A cold numba cache: the kernels compile during the first prefill. The run says so on its own line, and
    the summary gives the compile time apart from the prefill's speed (which it once swallowed: "prefill 6
    tokens at 0.1 tok/s"); the next run loads them and says nothing. A tiny float32 model on the fast path
    (q8), so only its cheap kernels (norm, attention) compile."""
    from tiny_models import write

    from framework.plugins.cpu.device import CpuDevice
    if not CpuDevice("q8").available:       # numba compiles for a CPU without AVX2: the kernels never run
        pytest.skip(f"cpu plugin's q8 path unavailable: {CpuDevice('q8').unavailable_reason}")
    model = write("llama", tmp_path / "tiny-llama.gguf", decoded=True)
    cmd = [sys.executable, "-m", "framework", "run", "-m", str(model), "Hello there", "-n", "3", "--backends", "cpu"]
    env = {**os.environ, "FRAMEWORK_CACHE": str(tmp_path / "cache"), "FRAMEWORK_CPU_MATMUL": "q8"}
    env.pop("NUMBA_CACHE_DIR", None)
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("compiling the cpu kernels, once: cached for later runs\n") == 1, first.stderr
    assert "compiling" not in first.stdout
    prefill, compiled = _run_line(first)
    assert 0 < prefill < compiled, first.stderr
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "compiling" not in second.stderr, second.stderr
    assert second.stdout == first.stdout                               # the same text from the cached kernels


def test_files_a_live_process_is_writing_are_left_to_it(tmp_path, capfd):
    """Another process guarding the folder records what its library wrote when it ends: one that starts
    meanwhile leaves those files alone (deleting them as unknown would make both build them again); once that
    process is gone, an unrecorded file is deleted."""
    folder = tmp_path / "lib"
    folder.mkdir()
    caches.Manifest(folder, "test cache file", "built again").record({})
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / f".writer.{writer.pid}").touch()
        (folder / "k.bin").write_bytes(b"being written by the other process")
        assert caches.Manifest(folder, "test cache file", "built again").check() == {}
        assert (folder / "k.bin").exists() and capfd.readouterr().err == ""
    finally:
        writer.kill()
        writer.wait()
    caches.Manifest(folder, "test cache file", "built again").check()
    assert not (folder / "k.bin").exists() and not (folder / f".writer.{writer.pid}").exists()
    assert f"test cache file {folder / 'k.bin'}" in capfd.readouterr().err


def test_compiling_another_process_did_for_this_one_is_said_once_and_left_out():
    """A Ray node's first kernel compiles, reported with its results: said once, and counted as filling (so the
    session's Stopwatch leaves them out of prefill and decode), as this process's own compiles are."""
    import io
    from contextlib import redirect_stderr
    clock = caches.Stopwatch()
    err = io.StringIO()
    with redirect_stderr(err):
        caches.filled_elsewhere(5.0, "compiling the kernels of node test-n9")
        caches.filled_elsewhere(2.0, "compiling the kernels of node test-n9")
    assert err.getvalue() == "compiling the kernels of node test-n9, once: cached for later runs\n"
    assert 7.0 <= clock.filled < 8.0


# -- framework cache ------------------------------------------------------------------------------------
def test_framework_cache_shows_and_clears(cache, tiny, capsys):
    Model(tiny)
    assert main(["cache"]) == 0
    shown = capsys.readouterr().out
    for name in ("gguf-index", "openvino", "xdna", "opencl"):
        assert name in shown
    assert str(cache / "gguf-index") in shown
    assert main(["cache", "clear", "gguf-index"]) == 0
    assert "cleared gguf-index" in capsys.readouterr().out and not (cache / "gguf-index").exists()
    assert main(["cache", "clear", "nosuch"]) == 2
    assert "unknown cache nosuch" in capsys.readouterr().err


def test_an_interrupted_write_leaves_nothing_behind(tmp_path, monkeypatch):
    target = tmp_path / "x.json"

    def interrupted(src, dst):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        caches.write_atomic(target, "{}")
    assert list(tmp_path.iterdir()) == []
