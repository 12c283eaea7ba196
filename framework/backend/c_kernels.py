"""What plugins whose kernels are the shared C kernels (the CUDA plugin's kernels.cu, the OpenCL plugin's
kernels.cl: the same kernel names, parameters and op codes) lower alike: the codes the kernels read as
OP_<NAME>, the parameters of the kernels both define (each plugin's signatures.py adds its own), the
source with its generated header and the kernels both hold (kernels/c_kernels.h), the verdicts the kernels'
limits give, and the ops' lowering (``Dialect``: element-wise, rows, rope, rows in and out, float products,
attention) over the plugin's launch grid, build options and quantized products."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..core import weight_words
from ..core.device_buffers import contiguous_strides
from ..contract import Tensor, Verdict
from ..core.graph import ops, reference
from .lowering import is_weight
from .signatures import Signatures
from .steps import ChunkArg, Step, pad4

BINARY_CODE = {"ADD": 0, "MUL": 1}
UNARY_CODE = {"scale": 0, "gelu": 1, "silu": 2, "tanh": 3, "sigmoid": 4, "softplus": 5}
GLU_ACTIVATION = {"geglu": "gelu", "swiglu": "silu"}      # GLU's activation, one of unary's functions
ROPE_NEOX = {"normal": 0, "neox": 1}
CHOICES = {("UNARY", "op"): {k: v for k, v in UNARY_CODE.items() if k != "scale"}, ("GLU", "op"): GLU_ACTIVATION,
           ("ROPE", "mode"): ROPE_NEOX}
OP_CODES = {**{k.lower(): v for k, v in BINARY_CODE.items()}, **UNARY_CODE}

# the kernels both dialects define with the same parameters (each plugin's signatures.py adds its own)
SIGNATURES = {
    "binary": "in a, in b, out o, u n, u4 ashape, u4 bshape, u op",
    "unary": "in a, out o, u n, u op, f s",
    "glu": "in g, in v, out o, u n, u op",
    "rms_norm": "in a, in gain, in r, out o, u ncols, f eps, u has_gain, u glen, u has_r",
    "soft_max": "in a, in mk, out o, u ncols, u t, u has_mask, f scale",
    "argmax_part": "in a, out p, u ncols, u nb, u per",
    "argmax": "in p, out o, u nb",
    "flash_attn": "in q, in k, in v, in mk, out o, u T, u H, u Hkv, u D, u S, u has_mask, f scale",
    "flash_attn_part": "in q, in k, in v, in mk, out p, u T, u H, u Hkv, u D, u S, u has_mask, f scale, u nc, u per",
    "flash_combine": "in p, out o, u TH, u D, u nc",
    "rope": "in a, ini pos, tab inv, in ff, out o, u T, u H, u D, u n_dims, u neox, u has_ff, f s",
    "set_rows": "in s, ini rows, out dst, u W, u T, u nrows",
    "cont": "in a, out o, u n, u4 shape, u4 strides",
    "get_rows_f": "el a, ini rows, out o, u W, u T, u row0, u nrows",
    "get_rows_q": "w a, ini rows, out o, u W, u T, u row0, u nrows, u gpr",
    "mul_mat_f": "el a, in b, out o, u N, u M, u K, u A0, u A1, u B0, u B1, u row0, u rows, u ld",
    "rowvec": "w w0, w w1, in a, in b, in gp, in gn, out y, in r, out o, u N, u col0, u write_y, u op, "
              "f eps, f eps1, f ys",
}


def elementwise(each) -> dict:
    """ADD, MUL, SCALE, UNARY, GLU and CONT, each one launch of the kernels binary, unary, glu or cont through
    ``each(lw, node, kernel, n_items, **args)``."""
    def op_binary(lw, n):
        each(lw, n, "binary", n.nelements, a=lw.ref(n.src[0]), b=lw.ref(n.src[1]), o=lw.new_val(n),
             n=n.nelements, ashape=pad4(n.src[0].shape), bshape=pad4(n.src[1].shape), op=BINARY_CODE[n.op])

    def op_scale(lw, n):
        each(lw, n, "unary", n.nelements, a=lw.ref(n.src[0]), o=lw.new_val(n), n=n.nelements,
             op=UNARY_CODE["scale"], s=float(n.params["scale"]))

    def op_unary(lw, n):
        each(lw, n, "unary", n.nelements, a=lw.ref(n.src[0]), o=lw.new_val(n), n=n.nelements,
             op=UNARY_CODE[n.params["op"]], s=1.0)

    def op_glu(lw, n):
        each(lw, n, "glu", n.nelements, g=lw.ref(n.src[0]), v=lw.ref(n.src[1]), o=lw.new_val(n),
             n=n.nelements, op=UNARY_CODE[GLU_ACTIVATION[n.params["op"]]])
    def op_cont(lw, n):
        a = lw.ref(n.src[0])
        st = a.strides or contiguous_strides(a.shape)
        each(lw, n, "cont", n.nelements, a=a, o=lw.new_val(n), n=n.nelements, shape=pad4(n.shape),
             strides=(0,) * (4 - len(st)) + tuple(st))
    return {"ADD": op_binary, "MUL": op_binary, "SCALE": op_scale, "UNARY": op_unary, "GLU": op_glu, "CONT": op_cont}


def split_attention(launch, lw, name: str, opts: dict, wg: int, nc: int, align: int, common: dict, o) -> None:
    """Flash decoding through the kernels flash_attn_part and flash_combine (``launch(lw, name, kernel,
    options, n_items, work_group, **args)``, the plugin's): the S keys in parts of a multiple of `align`,
    about nc of them, one work-group a (row, head, part) writing its partial sums, then one a (row, head)
    combining them into o. common: the attention's arguments (T, H, D, S among them)."""
    t, h, d, s = common["T"], common["H"], common["D"], common["S"]
    per = -(-(-(-s // nc)) // align) * align
    nc = -(-s // per)
    part = lw.scratch((t * h * nc * (d + 2),))
    launch(lw, f"FLASH_ATTN_EXT[split] {name}", "flash_attn_part", opts, t * h * nc * wg, wg, p=part, nc=nc,
           per=per, **common)
    launch(lw, f"FLASH_ATTN_EXT[combine] {name}", "flash_combine", opts, t * h * wg, wg, p=part, o=o, TH=t * h,
           D=d, nc=nc)


def matvec_teams(gpr: int, m: int, rows: int, wg: int, max_r: int, min_groups: int,
                 tpr: int | None = None) -> tuple[int, ...]:
    """(mm, tpr, r, wg) of the matrix-vector kernels for m rows of x (mm: m rounded up to a power of two)
    by `rows` weight rows of gpr 32-element groups: teams of tpr threads (given, or a power of two up to a
    warp and the row's groups) share r weight rows (max_r // mm at most), then r and the work-group's wg
    threads (down to 64, or a team) are halved while the matrix would make fewer than min_groups work-groups."""
    mm = next(x for x in (1, 2, 4, 8) if x >= m)
    tpr, r = tpr or min(32, 1 << max(0, gpr.bit_length() - 1)), max(1, max_r // mm)
    while r > 1 and rows < r * (wg // tpr) * min_groups:
        r //= 2
    while wg > max(64, tpr) and rows < (wg // tpr) * r * min_groups:
        wg //= 2
    return mm, tpr, r, wg


MAX_ELEMENTS = 1 << 32          # the kernels index elements with 32-bit integers
ARGMAX_PART, ARGMAX_PARTS = 2048, 256     # an ARGMAX part's fewest columns, a row's most parts


def argmax_parts(n: Tensor) -> tuple[int, int, int]:
    """(columns, rows, parts a row) of ARGMAX node n: parts of ARGMAX_PART columns or more, at most ARGMAX_PARTS."""
    s = n.src[0].shape[-1]
    return s, n.src[0].nelements // s, max(1, min(ARGMAX_PARTS, s // ARGMAX_PART))


def source(signatures: Signatures, path: Path) -> str:
    """A kernel source as it is built: the ARGS_ macros, the op codes (OP_<NAME>), then the file, each of its
    ``// @shared NAME`` lines replaced by that section of kernels/c_kernels.h (from its ``// @section NAME``
    line to the next: the kernels both plugins hold, written once; one string, as NVRTC and OpenCL build)."""
    codes = "".join(f"#define OP_{name.upper()} {code}\n" for name, code in OP_CODES.items())
    parts = re.split(r"^// @section (\w+)\n", (Path(__file__).parent / "kernels/c_kernels.h").read_text(), flags=re.M)
    shared, text = dict(zip(parts[1::2], parts[2::2])), path.read_text()
    for name in re.findall(r"^// @shared (\w+)$", text, flags=re.M):
        if name not in shared:
            raise ValueError(f"{path.name} asks for '// @shared {name}', which kernels/c_kernels.h has no section "
                             f"of; its sections: {', '.join(shared)}")
    text = re.sub(r"^// @shared (\w+)$", lambda m: shared[m.group(1)].rstrip("\n"), text, flags=re.M)
    return signatures.c_header() + codes + text


def verdict(dev, n: Tensor, kernels: str, max_head: int) -> Verdict:
    """Whether the shared C kernels compute node n on dev (its choice parameters, sizes and shapes), once the
    framework has applied supported_ops, refused_ops and Limits.dtypes. kernels: their name in refusals;
    max_head: the largest head the attention kernel holds. A value of a choice parameter with no code here
    (a function added to the op table later) is refused, never computed as another."""
    op = n.op
    for p in ops.spec(op).params:
        if p.choices and n.params.get(p.name) not in CHOICES.get((op, p.name), ()):
            return Verdict.no("unsupported_op", f"{op} with {p.name}={n.params.get(p.name)!r}: {kernels} "
                              f"take {', '.join(CHOICES.get((op, p.name), ())) or 'no value of it'}")
    for t in (n, *n.src):
        if t.nelements >= MAX_ELEMENTS:
            return Verdict.no("unsupported_shape", f"{t.describe()} has {t.nelements} elements; {dev.name} kernels "
                              f"index at most {MAX_ELEMENTS - 1}")
    if op == "MUL_MAT" and is_weight(n.src[0]) and len(n.src[0].shape) != 2:
        return Verdict.no("unsupported_shape", f"{dev.name} multiplies by 2-D weights only ({n.src[0].describe()})")
    if op == "FLASH_ATTN_EXT" and n.src[0].shape[2] > max_head:
        return Verdict.no("unsupported_shape", f"head size {n.src[0].shape[2]} is over the {max_head} the attention "
                          f"kernel of {dev.name} holds")
    if op == "ROPE" and n.shape[2] % 2:
        return Verdict.no("unsupported_shape", f"ROPE of an odd head size ({n.describe()})")
    if op == "SET_ROWS" and not n.src[0].storage.is_leaf:
        # into a cache leaf, or into an earlier SET_ROWS into one (the same buffer, written in place)
        return Verdict.no("unsupported_shape", f"{dev.name} writes rows into a pre-allocated tensor in place, not "
                          f"into {n.src[0].describe()}")
    if op == "SET_ROWS" and n.src[0].dtype.name != "F32":
        return Verdict.no("unsupported_dtype", f"{dev.name} writes F32 caches only ({n.src[0].describe()})")
    return Verdict.yes()


@dataclass(frozen=True)
class Launch:
    """A Step's kernel: which kernel of which build, and the tensor parameters it reads as vectors of 4
    (their offsets must then be multiples of 4)."""
    kernel: str
    options: dict
    vec4: tuple = ()


class Dialect:
    """The ops' lowering over the shared C kernels, as a kernel table's functions (``ops()``). A plugin
    subclasses it and gives its ``signatures``, ``grid(n_items, work_group)`` (a launch's grid: work-groups,
    or global and local sizes), ``base_options(dev)`` and ``quant_product(lw, n)`` (a product by a
    quantized weight: its own kernels); the rest has a default it may override."""
    signatures: Signatures
    rwg = 128          # work-group of the row kernels (RMS norm, softmax)
    awg = 64           # ... of attention
    ewg_max = 256      # ... of the one-thread-an-element kernels

    def grid(self, n_items: int, work_group: int) -> tuple:
        raise NotImplementedError(f"{type(self).__name__} gives no launch grid (c_kernels.Dialect.grid)")

    def base_options(self, dev) -> dict:
        raise NotImplementedError(f"{type(self).__name__} gives no build options (c_kernels.Dialect.base_options)")

    def quant_product(self, lw, n: Tensor):
        raise NotImplementedError(f"{type(self).__name__} has no products by quantized weights ({n.name}: "
                                  f"c_kernels.Dialect.quant_product)")

    def float_options(self, dev, dtype: str) -> dict:
        """The build of a float kernel reading elements of dtype (F32, or F16 as half)."""
        return {**self.base_options(dev), **({"ELEM": "half", "ELEM_HALF": 1} if dtype == "F16" else {})}

    def quant_options(self, dev, dtype: str) -> dict:
        """The build of a kernel reading a quantized weight of dtype: its layout's numbers (words a block,
        groups a block)."""
        lay = weight_words.layout(dtype)
        return {**self.base_options(dev), "QT_" + dtype: 1, "QT_WPB": lay.words_per_block,
                "QT_GPB": lay.block_elems // weight_words.GROUP}

    def ewg(self, dev) -> int:
        return self.ewg_max

    quant_x_lanes = 1        # threads of the quant_x kernel a 32-element group

    def quant_x(self, lw, x, m: int, k: int):
        """x (m rows of k) in 8 bits by the plugin's quant_x kernel (ggml's q8_1: 12 words a 32-element group,
        the codes, scale and sums its 8-bit products read); made once per computed value (Q, K and V of a layer
        share it), an argument (which a launch may write) each time."""
        key = ("quant_x", x.kind, x.idx, x.off, m, k)
        if x.kind == "val" and key in lw.memo:
            return lw.memo[key]
        groups = m * k // weight_words.GROUP
        xq = lw.scratch((groups * 12,))     # at element 0 of its buffer: the products read it as uint4s
        self.launch(lw, "QUANT_X", "quant_x", self.base_options(lw.dev), groups * self.quant_x_lanes, self.ewg(lw.dev),
                    x=x, xq=xq, groups=groups)
        if x.kind == "val":
            lw.memo[key] = xq
        return xq

    def angles(self, dev, inv):
        """The rope frequencies (the reference's, float64) as the kernel reads them."""
        return inv

    def attention(self, lw, name: str, common: dict, o) -> None:
        """softmax(q k^T * scale + mask) v into o (common: the kernels' parameters but o): one launch."""
        self.launch(lw, f"FLASH_ATTN_EXT {name}", "flash_attn", self.base_options(lw.dev),
                    common["T"] * common["H"] * self.awg, self.awg, o=o, **common)

    # -- launching ---------------------------------------------------------------------------------------
    def launch(self, lw, name: str, kernel: str, options: dict, n_items: int, work_group, /, vec4: tuple = (),
               **args) -> None:
        """One launch of `kernel` over n_items work-items (whole work-groups); every parameter of its
        signature given by name, and no other."""
        binds, rw, values = self.signatures.arguments(name, kernel, args)
        lw.emit(Step(name, Launch(kernel, options, tuple(vec4)), binds, rw, values, self.grid(n_items, work_group)))

    def each(self, lw, node, kernel: str, n_items: int, /, **args) -> None:
        """A one-thread-an-element kernel of the base build."""
        self.launch(lw, f"{node.op} {node.name}", kernel, self.base_options(lw.dev), n_items, self.ewg(lw.dev),
                    **args)

    def ops(self) -> dict:
        return {**elementwise(self.each), "RMS_NORM": self.rms_norm, "SOFT_MAX": self.soft_max, "ARGMAX": self.argmax,
                "FLASH_ATTN_EXT": self.flash_attn_ext, "ROPE": self.rope, "SET_ROWS": self.set_rows,
                "GET_ROWS": self.get_rows, "MUL_MAT": self.mul_mat}

    # -- the ops -----------------------------------------------------------------------------------------
    def rms_norm(self, lw, n):
        """RMS_NORM, with the MUL by a gain vector that is its only reader and the residual ADD after it
        (the layers' x + f(x)) where there are: one launch, the readers taken make none (rms_mul: that
        fusion, which the plan's fusions_off may turn off)."""
        mul = lw.sole_reader(n, "MUL") if "rms_mul" not in lw.fusions_off else None
        gain = mul.src[1] if mul is not None and lw.gain_ok(n, mul.src[1]) else None
        out = mul if gain is not None else n
        add = lw.residual_add(out) if gain is not None else None
        ncols = n.shape[-1]
        label = "RMS_NORM" + ("+MUL" if gain is not None else "") + ("+ADD" if add is not None else "")
        self.launch(lw, f"{label} {out.name}", "rms_norm", self.base_options(lw.dev),
                    n.nelements // ncols * self.rwg, self.rwg, a=lw.ref(n.src[0]),
                    gain=lw.ref(gain) if gain is not None else None, r=lw.ref(add.src[1]) if add is not None else None,
                    o=lw.new_val(add if add is not None else out), ncols=ncols, eps=float(n.params["eps"]),
                    has_gain=int(gain is not None), glen=ncols, has_r=int(add is not None))
        return [t for t in (out if gain is not None else None, add) if t is not None]

    def soft_max(self, lw, n):
        s = n.shape[-1]
        masked = len(n.src) > 1
        self.launch(lw, f"SOFT_MAX {n.name}", "soft_max", self.base_options(lw.dev), n.nelements // s * self.rwg,
                    self.rwg, a=lw.ref(n.src[0]), mk=lw.ref(n.src[1]) if masked else None, o=lw.new_val(n), ncols=s,
                    t=n.shape[-2] if len(n.shape) > 1 else 1, has_mask=int(masked), scale=float(n.params["scale"]))

    def argmax(self, lw, n):
        """Two launches: each row's columns in parts of ARGMAX_PART or more, a work-group a part (one work-group
        for a vocabulary of 262,144 is one multiprocessor's loads), then a work-group a row combines its parts."""
        s, rows, nb = argmax_parts(n)
        part, opts = lw.scratch((rows * nb * 3,)), self.base_options(lw.dev)
        self.launch(lw, f"ARGMAX[parts] {n.name}", "argmax_part", opts, rows * nb * self.rwg, self.rwg,
                    a=lw.ref(n.src[0]), p=part, ncols=s, nb=nb, per=-(-s // nb))
        self.launch(lw, f"ARGMAX {n.name}", "argmax", opts, rows * self.rwg, self.rwg, p=part, o=lw.new_val(n), nb=nb)

    def flash_attn_ext(self, lw, n):
        t, h, d = n.src[0].shape
        s, hkv, _ = n.src[1].shape
        masked = len(n.src) > 3
        common = dict(q=lw.ref(n.src[0]), k=lw.ref(n.src[1]), v=lw.ref(n.src[2]),
                      mk=lw.ref(n.src[3]) if masked else None, T=t, H=h, Hkv=hkv, D=d, S=s, has_mask=int(masked),
                      scale=float(n.params["scale"]))
        self.attention(lw, n.name, common, lw.new_val(n))

    def rope(self, lw, n):
        """ROPE, times the SCALE that is its only reader where there is one (Gemma's query scaling: one
        launch for both)."""
        scale = lw.sole_reader(n, "SCALE")
        t, h, d = n.shape
        p = n.params
        n_dims = int(p["n_dims"])
        inv = reference.rope_inv_freq(n_dims, float(p["freq_base"]), float(p["freq_scale"]))
        factors = lw.ref(n.src[2]) if len(n.src) > 2 else None
        self.launch(lw, f"ROPE{'+SCALE' if scale is not None else ''} {n.name}", "rope", self.base_options(lw.dev),
                    t * h * (d // 2), self.ewg(lw.dev), a=lw.ref(n.src[0]), pos=lw.ref(n.src[1]),
                    inv=self.angles(lw.dev, inv), ff=factors, o=lw.new_val(scale if scale is not None else n),
                    T=t, H=h, D=d, n_dims=n_dims, neox=ROPE_NEOX[p["mode"]], has_ff=int(factors is not None),
                    s=float(scale.params["scale"]) if scale is not None else 1.0)
        return [scale] if scale is not None else None

    def set_rows(self, lw, n):
        w, t = n.shape[1], n.src[2].shape[0]
        src, rows = lw.ref(n.src[1]), lw.ref(n.src[2])
        self.each(lw, n, "set_rows", w * t, s=src, rows=rows, dst=lw.in_place(n), W=w, T=t, nrows=n.shape[0])

    def get_rows(self, lw, n):
        """Rows of a float tensor, or of a weight chunk by chunk (a quantized one dequantized 8 values a
        work-item)."""
        a, rows = n.src
        o, rr, dev = lw.new_val(n), lw.ref(rows), lw.dev
        w, t = a.shape[1], rows.shape[0]
        if not is_weight(a):
            self.launch(lw, f"GET_ROWS {n.name}", "get_rows_f", self.base_options(dev), w * t, self.ewg(dev),
                        a=lw.ref(a), rows=rr, o=o, W=w, T=t, row0=0, nrows=a.shape[0])
            return
        qt, arg = a.dtype.name, lw.arg_of(a)
        for ci, (row0, nrows) in enumerate(lw.chunks(a)):
            common = dict(a=ChunkArg(arg, ci), rows=rr, o=o, W=w, T=t, row0=row0, nrows=nrows)
            if qt in weight_words.FLOAT_TYPES:
                self.launch(lw, f"GET_ROWS {n.name}", "get_rows_f", self.float_options(dev, qt), w * t,
                            self.ewg(dev), **common)
            else:
                self.launch(lw, f"GET_ROWS {n.name}", "get_rows_q", self.quant_options(dev, qt), w // 8 * t,
                            self.ewg(dev), gpr=w // weight_words.GROUP, **common)

    def mul_mat(self, lw, n):
        """A product: the plugin's quant_product for a quantized weight, else mul_mat_f (a float weight chunk
        by chunk, or two activations, broadcast over the two outer axes)."""
        a, b = n.src
        if is_weight(a) and a.dtype.name in weight_words.QUANT_TYPES:
            return self.quant_product(lw, n)
        o = lw.new_val(n)
        sa, sb = pad4(a.shape), pad4(b.shape)
        nrows, k, m = a.shape[-2], a.shape[-1], b.shape[-2]
        if is_weight(a):
            arg = lw.arg_of(a)
            parts = [(ChunkArg(arg, ci), row0, rows) for ci, (row0, rows) in enumerate(lw.chunks(a))]
            opts = self.float_options(lw.dev, a.dtype.name)
        else:
            parts, opts = [(lw.ref(a), 0, nrows)], self.base_options(lw.dev)
        for bind, row0, rows in parts:
            self.launch(lw, f"MUL_MAT {n.name}", "mul_mat_f", opts, sb[0] * sb[1] * m * rows, self.ewg(lw.dev),
                        a=bind, b=lw.ref(b), o=o, N=nrows, M=m, K=k, A0=sa[0], A1=sa[1], B0=sb[0], B1=sb[1],
                        row0=row0, rows=rows, ld=nrows)
        return None


# -- fused groups: the rowvec kernels (a weight's rows by x made in their prologue) ------------------------
class FusionTarget:
    """The core matcher's questions (fusion.plan) that devices on these kernels answer alike; a plugin's
    subclass adds its kernels' limits (product_fits, attn_fits, head_ok)."""
    weight_types = frozenset(weight_words.QUANT_TYPES)

    def __init__(self, dev):
        self.dev = dev

    def chunks(self, w) -> int:
        return len(self.dev.chunk_plan(w.dtype.name, w.shape))


# the prologue (how x is made) and the epilogue, as the build options F_PRO, F_PRE and F_EPI read them
PROLOGUE = {"plain": 0, "norm": 1, "combine": 0}     # combine: x is the attention's result (it combined itself)
PRE = {"": 0, "add": 1, "prenorm": 2, "scale": 3}
EPILOGUE = {"": 0, "add": 1, "glu": 2}
NO_PROLOGUE = {"a": None, "b": None, "gp": None, "gn": None, "y": None, "write_y": 0, "eps": 0.0, "eps1": 0.0,
               "ys": 1.0}


def prologue(lw, src) -> tuple[dict, dict]:
    """The arguments of a rowvec kernel's prologue (x made from a, b, gp and gn; y written where write_y) for
    the sources of a fusion group (fusion.Sources), and its build options."""
    p = src.prologue
    opts = {"F_PRO": PROLOGUE[p.src], "F_PRE": PRE[p.pre]}
    if p.src == "combine":       # the attention block combined its partials into its own result
        return dict(NO_PROLOGUE, a=lw.ref(src.fa)), opts
    args = dict(NO_PROLOGUE, a=lw.ref(src.a), eps=src.eps, eps1=src.eps1, ys=src.scale)
    for name, t in (("b", src.b), ("gp", src.g1), ("gn", src.g)):
        if t is not None:
            args[name] = lw.ref(t)
    if p.write_y:
        args.update(y=lw.new_val(src.y), write_y=1)
    return args, opts


def rowvec(launch, lw, g, build) -> None:
    """A product group of the core's plan (fusion.ProductGroup) as one rowvec launch a chunk of its weight: x
    made by the prologue, one weight or gate and up, the residual add or GLU in the epilogue. build(rows):
    the plugin's (build options, work-items, work-group) for a chunk of `rows` rows."""
    p, ws = g.src.prologue, [m.src[0] for m in g.muls]
    args, opts = prologue(lw, g.src)
    out, wargs = lw.new_val(g.out), [lw.arg_of(w) for w in ws]
    label = "+".join(filter(None, ["NORM" if p.src == "norm" else "", "MUL_MAT" + "x2" * (len(ws) > 1),
                                   {"add": "ADD", "glu": "GLU"}.get(g.epilogue)]))
    op = UNARY_CODE[GLU_ACTIVATION[g.out.params["op"]]] if g.epilogue == "glu" else 0
    opts.update(F_K=ws[0].shape[1], F_NW=len(ws), F_EPI=EPILOGUE[g.epilogue])
    for ci, (row0, rows) in enumerate(lw.chunks(ws[0])):
        build_opts, n_items, work_group = build(rows)
        launch(lw, f"{label} {g.out.name}", "rowvec", {**build_opts, **opts}, n_items, work_group,
               w0=ChunkArg(wargs[0], ci), w1=ChunkArg(wargs[1], 0) if len(ws) > 1 else None,
               r=lw.ref(g.residual) if g.residual is not None else None, o=out, N=rows, col0=row0, op=op,
               **dict(args, write_y=args["write_y"] * int(ci == 0)))
