"""A model split by layers across two devices of one plugin (two GPUs of one host), against the model on
one of them, and llama.cpp's own layer split (`-sm layer`) across the same two when llama-bench is given.

    python benchmarks/two_gpu.py --plugin vulkan [--model qwen25-coder-1.5b] [--llama-bench PATH]

For each of `PLUGIN:0` alone and `PLUGIN:0,PLUGIN:1` (the first capped with --device-memory at about half
the model's weights, so that the memory fit splits the layers), `framework run` greedy on a random-weight
file of the model's shapes and tensor types (benchmarks/vulkan_models.json, written here with
vulkan_bench.write_model and a placeholder vocabulary), a prompt of --prompt tokens and --decode tokens.
It prints each run's prefill and decode tok/s (the run's own summary), the layers each device kept,
the bytes copied between the two devices a decode step (from --plan), and whether the split's text is
the single device's (it must be: the same kernels run each layer, and a copy is exact).

benchmarks/two_gpu.sh runs it on a machine with two GPUs; on this machine PoCL exposes its CPU driver
twice (POCL_DEVICES="pthread pthread") for a dry run of the whole script:

    POCL_DEVICES="pthread pthread" python benchmarks/two_gpu.py --plugin opencl --model smollm2 \\
        --prompt 16 --decode 8 --allow-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

SUMMARY = re.compile(r"prefill (\d+) tokens at ([\d.]+) tok/s, decode (\d+) tokens at ([\d.]+) tok/s")


def model_file(name: str, work: Path) -> Path:
    from vulkan_bench import write_model
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    if name not in specs:
        raise SystemExit(f"no model {name!r} in benchmarks/vulkan_models.json (it has {', '.join(specs)}); "
                         f"benchmarks/vulkan_model_spec.py writes it")
    path = work / f"{name}-random-vocab.gguf"
    if not path.exists():
        write_model(name, specs[name], path, np.random.default_rng(0), vocab=True)
    return path


def check_devices(plugin: str, allow_cpu: bool) -> None:
    """Both devices exist, and are GPUs unless this is a dry run (wgpu and OpenCL can offer a CPU driver)."""
    out = subprocess.run([sys.executable, "-m", "framework", "backends"], capture_output=True, text=True,
                         timeout=300, check=False).stdout
    for name in (f"{plugin}:0", f"{plugin}:1"):
        row = next((ln.split() for ln in out.splitlines() if ln.startswith(name + " ")), None)
        if row is None or row[-1] != "available":
            raise SystemExit(f"{name} is not an available device here:\n{out}")
        if row[1] != "GPU" and not allow_cpu:
            raise SystemExit(f"{name} is a {row[1]} device, not a GPU (--allow-cpu for a dry run):\n{out}")


def framework_run(path: Path, backends: str, cap: str | None, args, plan: Path) -> dict:
    # the placeholder vocabulary has no piece for 'a': each one is a byte token, so the prompt's length
    # in tokens is its length in characters (plus BOS)
    cmd = [sys.executable, "-m", "framework", "run", "-m", str(path), "a" * (args.prompt - 1), "-n",
           str(args.decode), "--backends", backends, "--ctx", str(args.prompt + args.decode + 16),
           "--batch", str(args.prompt), "--plan", str(plan)]
    if cap:
        cmd += ["--device-memory", cap]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[3:6])} ... --backends {backends} exited {out.returncode}:\n{out.stderr}")
    m = SUMMARY.search(out.stderr)         # the summary goes to stderr, the text to stdout
    if not m:
        raise SystemExit(f"no summary line in the run's output:\n{out.stderr}")
    plans = json.loads(plan.read_text())["plans"]
    decode = next(p for name, p in plans.items() if name.startswith("decode"))
    devices = backends.split(",")
    crossing = [c for c in decode["copies"] if c["src_device"] in devices and c["dst_device"] in devices
                and c["src_device"] != c["dst_device"]]
    return {"backends": backends, "cap": cap, "prefill_tok_s": float(m[2]), "decode_tok_s": float(m[4]),
            "kept": (decode["fit"] or {}).get("kept", {}), "copies_per_decode_step": len(crossing),
            "bytes_per_decode_step": sum(c["nbytes"] for c in crossing),
            "text": out.stdout}


def llama_bench(binary: str, path: Path, split: str, args) -> dict:
    cmd = [binary, "-m", str(path), "-ngl", "99", "-sm", split, "-p", str(args.prompt), "-n", str(args.decode),
           "-r", str(args.reps), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    if out.returncode != 0:
        return {"split": split, "error": f"exit {out.returncode}: {out.stderr[-800:]}"}
    rows = json.loads(out.stdout)
    return {"split": split, **{("prefill_tok_s" if r["n_prompt"] else "decode_tok_s"): r["avg_ts"] for r in rows}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plugin", default="vulkan", help="the plugin whose devices :0 and :1 split the model "
                    "(default: vulkan)")
    ap.add_argument("--model", default="qwen25-coder-1.5b", help="a model of benchmarks/vulkan_models.json "
                    "(default: qwen25-coder-1.5b)")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens (default: 256)")
    ap.add_argument("--decode", type=int, default=128, help="generated tokens (default: 128)")
    ap.add_argument("--cap", default=None, help="--device-memory for :0 that forces the split (default: half "
                    "the file's size)")
    ap.add_argument("--llama-bench", default=None, help="llama-bench, to run -sm none and -sm layer on the same "
                    "file (default: not run)")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench -r (default: 3)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds for each run (default: 300)")
    ap.add_argument("--allow-cpu", action="store_true", help="accept devices on the host CPU (a dry run; "
                    "its figures are not GPU figures)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"), help="where two_gpu.json goes "
                    "(default: $OUT or /tmp)")
    args = ap.parse_args()

    check_devices(args.plugin, args.allow_cpu)
    work = Path(tempfile.mkdtemp(prefix="two_gpu-"))
    path = model_file(args.model, work)
    cap = args.cap or f"{args.plugin}:0={path.stat().st_size // 2 // (1 << 20)}M"
    if not cap.startswith(f"{args.plugin}:0="):
        cap = f"{args.plugin}:0={cap}"
    one = framework_run(path, f"{args.plugin}:0", None, args, work / "one.json")
    two = framework_run(path, f"{args.plugin}:0,{args.plugin}:1", cap, args, work / "two.json")
    rows = [one, two]
    if args.llama_bench:
        rows += [llama_bench(args.llama_bench, path, split, args) for split in ("none", "layer")]
    same_text = one.pop("text") == two.pop("text")
    if not args.allow_cpu:
        print("(figures from GPUs: run with --allow-cpu only for a dry run on the host CPU)")
    else:
        print("DRY RUN on the host CPU: these are not GPU figures")
    print(f"{args.model}, {path.stat().st_size / 1e9:.2f} GB file, prompt {args.prompt}, decode {args.decode}")
    for r in rows:
        print(json.dumps(r))
    print(f"split / one device: prefill {two['prefill_tok_s'] / one['prefill_tok_s']:.2f}x, decode "
          f"{two['decode_tok_s'] / one['decode_tok_s']:.2f}x; {two['bytes_per_decode_step']} bytes in "
          f"{two['copies_per_decode_step']} copies a decode step; the split's text is "
          f"{'the same as' if same_text else 'NOT the same as'} one device's")
    Path(args.out, "two_gpu.json").write_text(json.dumps({"rows": rows, "same_text": same_text}, indent=1))
    if not same_text:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
