"""The cpu plugin's nodes against llama.cpp's intermediate tensors, op by op, on one step.

DUMP is what benchmarks/ggml_intermediates.sh wrote (llama.cpp's CPU backend: every tensor whole, and the
prompt's token ids). The same ids run through the cpu plugin on each PATH (q8: the default, f32:
FRAMEWORK_CPU_MATMUL=f32), each node's value matched to llama.cpp's tensor of the same role, two ways:

- chained: the framework runs on its own values, as in a real run; the NMSE against llama.cpp's tensor
  grows along the layers with whatever each op adds;
- local: every matched node's inputs are llama.cpp's own tensors (the framework's value replaced by
  llama.cpp's once compared, the KV cache by llama.cpp's float16 one), so each NMSE is that op's own
  difference from ggml's arithmetic.

NMSE is sum((ours - ggml)^2) / sum(ggml^2), as ggml's test-backend-ops computes it. Where llama.cpp's last
layer keeps only the rows that give logits, the framework's last rows are compared. At the top, the logits'
top two; at the end, per op, the largest local NMSE on each path, the first node over --noise on q8, and
each layer's output on the two chained paths (all rows, and the last row alone), then node by node the
first layer where the q8 path's last row is farther from llama.cpp than the f32 path's.

--emulate gelu,attention runs the q8 path (and f32's GELU) with ggml-cpu's arithmetic for those two ops
instead of the plugin's, to measure what each accounts for: gelu, GGML_GELU_FP16's table (x rounded to
float16, its GELU rounded to float16, times the up value in float32; 0 below -10, x above 10); attention,
ggml_compute_forward_flash_attn_ext_f16 over llama.cpp's float16 cache (q, k and v rounded to float16,
the keys in order with an online softmax, the weighted values summed in a float16 accumulator, rescaled in
float16 at each new maximum, divided by the sum of weights at the end), or where the dump was taken
without flash attention (FLASH_ATTN=off), its two products over the float16 cache (q and the softmax's
weights rounded to float16).

    benchmarks/ggml_intermediates.sh MODEL.gguf "PROMPT" DUMP
    .venv/bin/python benchmarks/q8_vs_ggml_ops.py MODEL.gguf DUMP [--paths q8,f32]
    PREFILL=6 benchmarks/ggml_intermediates.sh MODEL.gguf "PROMPT" DUMP   # the last of several decode steps
    .venv/bin/python benchmarks/q8_vs_ggml_ops.py MODEL.gguf DUMP --prefill 6
    .venv/bin/python benchmarks/q8_vs_ggml_ops.py MODEL.gguf DUMP --against OTHER   # llama.cpp against itself
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from framework.core.graph import reference as kernels  # noqa: E402
from framework.model.model import Model  # noqa: E402
from framework.plugins.cpu import attention  # noqa: E402
from framework.plugins.cpu import device as cpu  # noqa: E402
from framework.runtime.session import Session  # noqa: E402


def f16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def ggml_gelu_table(x):
    """GGML_GELU_FP16's GELU (ggml_vec_geglu_f32 multiplies it by the up value in float32)."""
    y = f16(kernels.gelu(f16(x)))
    return np.where(x >= 10, x, np.where(x <= -10, np.float32(0), y)).astype(np.float32)


def ggml_flash_attn(q, k, v, mask=None, *, scale):
    """ggml-cpu's FLASH_ATTN_EXT with a float16 K and V: q (T, H, D), k and v (S, Hkv, D), mask (T, S)."""
    t, h, d = q.shape
    group = h // k.shape[1]
    qh = f16(q).astype(np.float64)
    kh, vh = f16(k).astype(np.float64), f16(v)
    big_m = np.full((t, h), -np.inf, np.float32)
    total = np.zeros((t, h), np.float32)
    acc = np.zeros((t, h, d), np.float32)            # float16 values, held in float32
    for s in range(k.shape[0]):
        m = np.zeros((t, 1), np.float32) if mask is None else np.asarray(mask, np.float32)[:, s:s + 1]
        kk = np.repeat(kh[s], group, axis=0)           # (H, D)
        score = (np.einsum("thd,hd->th", qh, kk).astype(np.float32) * np.float32(scale) + m).astype(np.float32)
        live = np.broadcast_to(m != -np.inf, (t, h))
        new = live & (score > big_m)
        with np.errstate(invalid="ignore", over="ignore"):
            ms = np.where(new, np.exp(big_m - score), np.float32(1)).astype(np.float32)
            big_m = np.where(new, score, big_m)
            vs = np.where(new, np.float32(1), np.exp(score - big_m)).astype(np.float32)
        acc = np.where(new[..., None], f16(acc * ms[..., None]), acc)
        vv = np.repeat(vh[s], group, axis=0)[None].astype(np.float64)
        summed = f16((acc + vv * vs[..., None].astype(np.float64)).astype(np.float32))
        acc = np.where(live[..., None], summed, acc)
        total = np.where(live, total * ms + vs, total).astype(np.float32)
    inv = np.where(total == 0, np.float32(0), np.float32(1) / np.where(total == 0, 1, total)).astype(np.float32)
    return (acc * inv[..., None]).astype(np.float32)


def ggml_attention_products(q, k, v, mask=None, *, scale):
    """ggml-cpu's attention without flash attention over a float16 cache: KQ a product of the float16
    keys by q rounded to float16, the softmax in float32 (its sum in double), KQV a product of the float16
    values by the weights rounded to float16 (a float16 matrix's product rounds its other side so)."""
    group = q.shape[1] // k.shape[1]
    kh = np.repeat(f16(k), group, axis=1).astype(np.float64)
    vh = np.repeat(f16(v), group, axis=1).astype(np.float64)
    scores = np.einsum("thd,shd->hts", f16(q).astype(np.float64), kh).astype(np.float32) * np.float32(scale)
    if mask is not None:
        scores = scores + np.asarray(mask, np.float32)[None]
    top = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - top).astype(np.float32)
    w = e * (np.float32(1) / e.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32))
    return np.einsum("hts,shd->thd", f16(w).astype(np.float64), vh).astype(np.float32)


def emulate(names: str, flash: bool):
    """Swap the plugin's GELU (both paths) and fast-path attention for ggml-cpu's arithmetic (its flash
    attention's or its products', as the dump was taken)."""
    if "gelu" in names:
        kernels.GLU["geglu"] = ggml_gelu_table
    if "attention" in names:
        attention.flash_attn_ext = ggml_flash_attn if flash else ggml_attention_products


def read_dump(folder: Path) -> tuple[list[dict], list[int]]:
    """ggml_dump's index (one dict per tensor, in graph order) and the prompt's token ids."""
    tensors = []
    for line in (folder / "index.tsv").read_text().splitlines():
        i, name, op, dtype, *ne, file = line.split("\t")
        tensors.append({"i": int(i), "name": name, "op": op, "type": dtype, "ne": tuple(int(n) for n in ne),
                        "file": folder / file})
    ids = [int(t) for t in (folder / "tokens.txt").read_text().split()]
    return tensors, ids


def check_printout(folder: Path, tensors: list[dict]) -> str:
    """llama-eval-callback's printout of the same prompt (a prefill; the script writes it beside the dump)
    against the dump: the same tensors in the same order, and each printed sum (float32) near the dump's."""
    path = folder / "eval-callback.txt"
    if not path.is_file():
        return "no llama-eval-callback printout beside the dump"
    text = path.read_text()
    heads = re.findall(r"common_debug_cb_eval:\s+(.+?) = \(\w+\)\s+(\w+)\(", text)
    sums = [float(x) for x in re.findall(r"sum = (\S+)", text)]
    if [(n.strip(), op) for n, op in heads] != [(t["name"], t["op"]) for t in tensors]:
        return f"llama-eval-callback printed other tensors than the dump holds ({len(heads)} against {len(tensors)})"
    worst = max(abs(GgmlTensors.value(t).sum(dtype=np.float64) - s) / max(1.0, abs(s)) for t, s in zip(tensors, sums))
    return (f"llama-eval-callback printed the dump's {len(tensors)} tensors in its order, "
            f"their sums within {worst:.1e} (relative)")


class GgmlTensors:
    """llama.cpp's tensor for a framework node, by the names both graphs give (the framework's builder
    follows llama.cpp's naming; the few nodes ggml leaves unnamed are found next to a named one)."""

    # framework name (layer stripped) -> ggml's (name, op), or (name, op, offset) from a named neighbour;
    # op None: whatever op ggml gave that name (kqv_out is a RESHAPE with flash attention, a CONT without)
    RENAMED = {"inp_embd": ("embd", "GET_ROWS"),
               "Qcur_3d": ("Qcur", "RESHAPE"), "Kcur_3d": ("Kcur", "RESHAPE"), "Vcur_3d": ("Vcur", "RESHAPE"),
               "Qcur_rope": ("Qcur", "ROPE"), "Kcur_rope": ("Kcur", "ROPE"),
               "Qcur_scaled": ("Qcur", "ROPE", 1),
               "kqv": ("kqv_out", None, -1), "kqv_merged": ("kqv_out", None),
               "attn_out": ("kqv_out", None, 1), "ffn_geglu": ("ffn_geglu", "GEGLU")}
    # the caches after this step's rows are written: llama.cpp's whole float16 cache (its n_ctx rows);
    # without flash attention llama.cpp keeps V transposed (a value's dimensions by position)
    CACHES = {"k_cache_write": ["cache_k_l{} (view)"],
              "v_cache_write": ["cache_v_l{} (view)", "cache_v_l{} (reshaped) (view)"]}

    def __init__(self, tensors: list[dict]):
        self.tensors = tensors
        self.first = {}
        for t in tensors:
            self.first.setdefault((t["name"], t["op"]), t["i"])
            self.first.setdefault((t["name"], None), t["i"])

    def find(self, name: str, op: str) -> dict | None:
        m = re.fullmatch(r"(.*?)(-\d+)?(_rms)?", name)
        base, layer, rms = m.group(1), m.group(2) or "", m.group(3)
        if rms:                        # the RMS_NORM just before the MUL by the norm's weight
            return self._at((name[:-4], "MUL"), -1)
        if base in self.CACHES and layer:
            found = (self._at((n.format(layer[1:]), "SET_ROWS"), 0) for n in self.CACHES[base])
            return next((t for t in found if t is not None), None)
        gname, gop, *offset = self.RENAMED.get(base, (base, op))
        t = self._at((gname + layer, gop), offset[0] if offset else 0)
        # the framework's attention is one FLASH_ATTN_EXT; without flash attention ggml has no such tensor
        return None if t is None or (op == "FLASH_ATTN_EXT" and t["op"] != op) else t

    def _at(self, key, offset: int) -> dict | None:
        i = self.first.get(key)
        return None if i is None else self.tensors[i + offset]

    @staticmethod
    def value(t: dict) -> np.ndarray:
        return np.fromfile(t["file"], dtype=np.float32)


def aligned(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray | None:
    """Our value flattened as theirs, or our last rows where llama.cpp kept only those; None: no match."""
    flat = np.asarray(ours, np.float32).reshape(-1)
    if flat.size == theirs.size:
        return flat
    row = flat.size // ours.shape[0]
    if theirs.size % row == 0 and theirs.size < flat.size:
        return flat[-theirs.size:]
    return None


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    den = float(np.sum(b.astype(np.float64) ** 2))
    return float(np.sum((a.astype(np.float64) - b) ** 2) / den) if den else float("nan")


PROGRAM_INIT = cpu.CpuProgram.__init__


class Recorder:
    """CpuProgram.run node by node (the loop of ReferenceProgram.run, one node at a time), each matched
    node's NMSE kept; local: llama.cpp's value goes on in the framework's place."""

    def __init__(self, ggml: GgmlTensors, local: bool):
        self.ggml, self.local, self.rows = ggml, local, []
        self.on = False           # only the step that llama.cpp's dump holds is compared

    def install(self):
        recorder = self

        def init(program, fragment, fast):
            PROGRAM_INIT(program, fragment, fast)
            program.nodes = list(fragment.nodes)

        def run(program, args):
            if program.shared is not None:
                program.shared.clear()
            vals = list(args) + [None] * (program.n_slots - program.n_args)
            for node, (fn, out, ins) in zip(program.nodes, program.steps):
                vals[out] = recorder.visit(node, fn(*[vals[i] for i in ins]))
            return [vals[i] for i in program.out_slots]

        cpu.CpuProgram.__init__, cpu.CpuProgram.run = init, run

    def visit(self, node, value):
        t = self.ggml.find(node.name, node.op) if self.on else None
        if t is None or not isinstance(value, np.ndarray):
            return value
        theirs = GgmlTensors.value(t)
        if t["name"].endswith("(reshaped) (view)"):       # the transposed V cache, back to (position, value)
            theirs = theirs.reshape(value.shape[::-1]).T.reshape(-1)
        ours = aligned(value, theirs)
        if ours is None:
            return value
        row = value.size // value.shape[0]          # the last row: the one whose logits are read
        self.rows.append((node.name, node.op, t["name"], t["op"], nmse(ours, theirs),
                          nmse(ours[-row:], theirs[-row:])))
        if not self.local:
            return value
        replaced = np.array(value, dtype=np.float32, copy=True).reshape(-1)
        replaced[replaced.size - theirs.size:] = theirs
        return replaced.reshape(value.shape)


N_CTX = 512        # llama.cpp's context in ggml_intermediates.sh: the caches compare row for row


def run_path(model, ids, ggml, path, local, prefill):
    """The framework's steps as llama.cpp's dump took them: one prefill of `prefill` tokens (all of them
    when None), then a decode step a token; the last step compared."""
    recorder = Recorder(ggml, local)
    recorder.install()
    session = Session(model, [cpu.CpuDevice(path)], n_ctx=N_CTX)
    first = prefill or len(ids)
    steps = [ids[:first]] + [[t] for t in ids[first:]]
    for step in steps[:-1]:
        session.eval(step)
    recorder.on = True
    return recorder.rows, session.eval(steps[-1])


def top2(logits: np.ndarray) -> str:
    a, b = np.argsort(logits)[::-1][:2]
    return f"top-1 {a} ({logits[a]:.3f}), second {b} ({logits[b]:.3f}), gap {logits[a] - logits[b]:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("dump", type=Path)
    ap.add_argument("--paths", default="q8,f32")
    ap.add_argument("--prefill", type=int, help="as the dump's PREFILL: that many tokens in one prefill, then "
                    "a decode step each (default: the whole prompt in one prefill)")
    ap.add_argument("--against", type=Path, help="another dump of the same tokens (PREFILL=N): llama.cpp's "
                    "last rows against each other, no framework run")
    ap.add_argument("--emulate", default="", help="gelu,attention: ggml-cpu's arithmetic for those ops (above)")
    ap.add_argument("--noise", type=float, default=1e-9,
                    help="local NMSE taken as float noise (default 1e-9: summation order alone)")
    args = ap.parse_args()
    if args.against:
        return against(args.dump, args.against)
    tensors, ids = read_dump(args.dump)
    flash = any(t["op"] == "FLASH_ATTN_EXT" for t in tensors)
    emulate(args.emulate, flash)
    ggml = GgmlTensors(tensors)
    model = Model(args.model)
    if ggml.first.get(("result_output", "MUL_MAT")) is None:
        raise SystemExit(f"{args.dump}: no result_output tensor: not a complete ggml_dump folder")
    theirs = GgmlTensors.value(tensors[ggml.first[("result_output", "MUL_MAT")]])
    print(f"prompt: {len(ids)} tokens {ids}; llama.cpp's flash attention {'on' if flash else 'off'}")
    if args.prefill is None:
        print(check_printout(args.dump, tensors))
    print(f"llama.cpp: {top2(theirs)}")
    paths = args.paths.split(",")
    table = {}
    for path in paths:
        for local in (False, True):
            rows, logits = run_path(model, ids, ggml, path, local, args.prefill)
            table[(path, local)] = rows
            if not local:      # the local run's logits are llama.cpp's own (its last node replaced)
                print(f"{path}: {top2(logits)}; logits NMSE {nmse(logits, theirs):.3e}", flush=True)
    names = [(r[0], r[1], r[2], r[3]) for r in table[(paths[0], False)]]
    head = "".join(f" {p + ' ' + m:>14}" for p in paths for m in ("chained", "local"))
    print(f"\n{'node':<22} {'op':<14} {'ggml tensor':<26}{head}")
    for k, (name, op, gname, gop) in enumerate(names):
        cells = "".join(f" {table[(p, local)][k][4]:>14.3e}" for p in paths for local in (False, True))
        print(f"{name:<22} {op:<14} {gname + ' ' + gop:<26}{cells}")
    if "q8" in paths and "f32" in paths:
        report(names, table, args.noise)


def against(dump: Path, other: Path, shown: int = 8) -> None:
    """llama.cpp against itself: each tensor's last row in `dump` and in `other`, the same tokens taken in
    other steps (a prefill and decode steps), in graph order; the first that differ, and the logits."""
    a, _ = read_dump(dump)
    b, _ = read_dump(other)
    differ = []
    for x, y in zip(a, b):
        if (x["name"], x["op"]) != (y["name"], y["op"]):
            raise SystemExit(f"{dump} and {other} hold other graphs: {x['name']} against {y['name']}")
        # caches, views, and attention's by-head products without flash attention: not laid out by rows
        if x["op"] in ("SET_ROWS", "VIEW", "PERMUTE") or x["name"].startswith(("cache_", "kq-", "kq_", "kqv-")):
            continue
        u, v = GgmlTensors.value(x), GgmlTensors.value(y)
        row = min(u.size, v.size)
        if u.size % row == 0 and v.size % row == 0 and (e := nmse(u[-row:], v[-row:])) > 0:
            differ.append((x["name"], x["op"], e))
    print(f"llama.cpp, {dump} against {other}, the last row: {len(differ)} tensors differ; the first:")
    for name, op, e in differ[:shown]:
        print(f"  {name:<24} {op:<15} {e:.3e}")
    if differ:
        print(f"  ... the logits (result_output): {differ[-1][2]:.3e}")
    for folder, tensors in ((dump, a), (other, b)):
        print(f"  {folder}: {top2(GgmlTensors.value(tensors[-1]))}")


def report(names, table, noise):
    """Per op: the largest local NMSE on each path; then the first node over `noise` on q8."""
    q8, f32 = table[("q8", True)], table[("f32", True)]
    # a cache holds the earlier steps' rows as each path wrote them: not one op's own difference
    ops = [k for k in range(len(names)) if names[k][1] != "SET_ROWS"]
    print(f"\nlocal NMSE by op, largest over the nodes (caches aside): {'op':<16} {'nodes':>5} {'q8':>10} {'f32':>10}")

    def kind(k):        # the framework's op, and ggml's where it differs (kqv_merged: CONT without flash attention)
        op, gop = names[k][1], names[k][3]
        return op if op == gop or op == "GLU" else f"{op} ({gop})"

    for op in dict.fromkeys(kind(k) for k in ops):
        of = [k for k in ops if kind(k) == op]
        print(f"{'':<58}{op:<16} {len(of):>5} {max(q8[k][4] for k in of):>10.3e} {max(f32[k][4] for k in of):>10.3e}")
    over = [k for k in ops if q8[k][4] > noise]
    print(f"nodes over {noise:.0e} on q8: {len(over)} of {len(ops)}, by op "
          f"{dict(collections.Counter(kind(k) for k in over))}")
    if over:
        k = over[0]
        print(f"the first: {names[k][0]} ({names[k][1]}, ggml's {names[k][2]}): q8 {q8[k][4]:.3e}, f32 {f32[k][4]:.3e}")
    chained_q8, chained_f32 = table[("q8", False)], table[("f32", False)]
    print("chained, each layer's output (l_out), all rows and the last row (the one whose logits are read; "
          "llama.cpp's last layer keeps it alone): q8, f32")
    first = None
    for k in (k for k in ops if names[k][0].startswith("l_out-")):
        (a, a1), (b, b1) = chained_q8[k][4:6], chained_f32[k][4:6]
        far = "  q8 farther (last row)" if a1 > b1 else ""
        first = first or (names[k][0] if far else None)
        print(f"  {names[k][0]:<10} all rows {a:.3e} {b:.3e}  last row {a1:.3e} {b1:.3e}{far}")
    if first:
        layer = first.split("-")[1]
        print(f"layer {layer}, the first where the q8 path's last row is farther from llama.cpp than f32's, node by "
              "node (last row, chained q8, chained f32, local q8):")
        for k in (k for k in ops if re.search(f"-{layer}(_rms)?$", names[k][0])):
            cells = f"{chained_q8[k][5]:.3e} {chained_f32[k][5]:.3e} {q8[k][4]:.3e}"
            print(f"  {names[k][0]:<22} {names[k][1]:<15} {cells}")


if __name__ == "__main__":
    main()
