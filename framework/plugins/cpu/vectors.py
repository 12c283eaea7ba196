"""The inner loops of the quantized products (quantized.py), written as LLVM vector IR through numba
intrinsics.

A row's product is a sum over its blocks of (weight scale) x (activation scale) x (integer dot product
of the block's 32 weights and 32 activations). Numba's loop vectorizer does not find that shape (it
unrolls the 32-element loop and vectorizes nothing), and a horizontal sum per block would cost more
than the block's arithmetic. So, as ggml's CPU kernels do, each block's integer products land in eight
int32 lanes (four products each), are converted to float and multiplied into eight float lanes by the
block's two scales, and the lanes are summed once per row. The product of unsigned bytes by signed ones
is the CPU's own instruction:

* ``vnni``: AVX-512 VNNI's ``vpdpbusd`` (32 byte products into 8 lanes, one instruction);
* ``avx2``: AVX2's ``vpmaddubsw`` then ``vpmaddwd`` (pairs into int16, then into int32).

The path is chosen from the features numba compiles for (its codegen's target, the host CPU unless
NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say otherwise), so a kernel cached on disk always matches the path
it was built with. The two paths compute the same integers, and the float arithmetic around them is
plain IEEE in a fixed order (no fast-math, no multiply-add contraction, the lanes summed in order), so a
product's result is the same bit for bit whichever path, CPU or thread count computed it. A CPU without
AVX2 has neither path (``isa_of`` says so and the plugin keeps the float32 products). Signed weights
(Q8_0, Q6_K, Q3_K, IQ4_NL, IQ4_XS) go through the sign trick of ggml's AVX2 code: |w| times x with w's
sign. The unsigned operand never exceeds 128 (|w| <= 128, unsigned values <= 63), so the int16 pairs of
``vpmaddubsw`` cannot saturate (2 x 128 x 127 < 32768).

Each weight type is a ``Layout``: its block's bytes, how many groups of 32 values a block holds, and
for each group the 32 weight bytes (unpacked), their scale and, for types with a minimum or an offset,
the factor that multiplies the activations' group sum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32 = ir.HalfType(), ir.FloatType()
V32I8, V8I32 = ir.VectorType(I8, 32), ir.VectorType(I32, 8)
V8F32, V16I16 = ir.VectorType(F32, 8), ir.VectorType(I16, 16)
QK = 32


ISAS = {"vnni": "AVX-512 VNNI (vpdpbusd)", "avx2": "AVX2 (vpmaddubsw, vpmaddwd)"}


def isa_of(context) -> str:
    """'vnni', 'avx2' or '' (neither): the product instructions for the features numba compiles for."""
    return isa_for(context.codegen().magic_tuple()[2])


def product_isa(context) -> str:
    """isa_of, for a kernel that has no form without AVX2: its absence is an error naming the CPU and the fix."""
    isa = isa_of(context)
    if not isa:
        raise RuntimeError("the CPU plugin's quantized products need AVX2; numba compiles for "
                           f"{context.codegen().magic_tuple()[1]} without it: set FRAMEWORK_CPU_MATMUL=f32")
    return isa


def isa_for(features: str) -> str:
    flags = set(features.split(","))
    if {"+avx512vnni", "+avx512vl", "+avx512bw"} <= flags:
        return "vnni"
    return "avx2" if "+avx2" in flags else ""


def _const_vec(ty, values):
    return ir.Constant(ir.VectorType(ty, len(values)), list(values))


def _splat(builder, value, n: int):
    vty = ir.VectorType(value.type, n)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(I32, n), [0] * n))


def _declare(builder, name: str, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


class Emitter:
    """IR helpers over one weight row (uint8) and the activations, inside an intrinsic's codegen."""

    def __init__(self, builder, isa: str, row_ptr):
        self.b, self.isa, self.row = builder, isa, row_ptr

    def ptr(self, base, offset, ty):
        return self.b.bitcast(self.b.gep(base, [offset]), ty.as_pointer())

    def load(self, base, offset, ty):
        return self.b.load(self.ptr(base, offset, ty), align=1)

    def byte(self, offset):
        """Row byte at offset, as int32 (0..255)."""
        return self.b.zext(self.load(self.row, offset, I8), I32)

    def sbyte(self, offset):
        return self.b.sext(self.load(self.row, offset, I8), I32)

    def f16(self, offset):
        return self.b.fpext(self.load(self.row, offset, F16), F32)

    def bytes32(self, offset):
        return self.load(self.row, offset, V32I8)

    def nibbles16(self, offset):
        """The 16 bytes at offset as 32 values: low nibbles first (elements 0-15), then high ones."""
        b = self.b
        v = self.load(self.row, offset, ir.VectorType(I8, 16))
        lo = b.and_(v, _const_vec(I8, [15] * 16))
        hi = b.lshr(v, _const_vec(I8, [4] * 16))
        return b.shuffle_vector(lo, hi, _const_vec(I32, range(32)))

    def high_bits(self, offset):
        """The uint32 at offset as 32 bytes: bit i of it, times 16, in byte i (Q5's fifth bit). As ggml's
        bytes_from_bits_32: each of the 4 bytes copied to 8 lanes, each lane tested against its bit."""
        b = self.b
        word = b.bitcast(self.load(self.row, offset, I32), ir.VectorType(I8, 4))
        spread = b.shuffle_vector(word, ir.Constant(ir.VectorType(I8, 4), ir.Undefined),
                                  _const_vec(I32, [i // 8 for i in range(32)]))
        bit = _const_vec(I8, [1 << (i % 8) for i in range(32)])
        is_set = b.icmp_unsigned("!=", b.and_(spread, bit), ir.Constant(V32I8, None))
        return b.select(is_set, _const_vec(I8, [16] * 32), ir.Constant(V32I8, None))

    def dot(self, u, s):
        """<8 x i32>: lane j = sum of u[4j + i] * s[4j + i], u unsigned and s signed bytes (<32 x i8>)."""
        b = self.b
        zero = ir.Constant(V8I32, None)
        if self.isa == "vnni":
            fn = _declare(b, "llvm.x86.avx512.vpdpbusd.256", V8I32, [V8I32, V8I32, V8I32])
            return b.call(fn, [zero, b.bitcast(u, V8I32), b.bitcast(s, V8I32)])
        pairs = b.call(_declare(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [V32I8, V32I8]), [u, s])
        return b.call(_declare(b, "llvm.x86.avx2.pmadd.wd", V8I32, [V16I16, V16I16]),
                      [pairs, _const_vec(I16, [1] * 16)])

    def sdot(self, w, s):
        """As dot, with w signed too (|w| times s with w's sign)."""
        sign = _declare(self.b, "llvm.x86.avx2.psign.b", V32I8, [V32I8, V32I8])
        return self.dot(self.b.call(sign, [w, w]), self.b.call(sign, [s, w]))


@dataclass
class Group:
    """32 weights of a block: their bytes (<32 x i8>), signed or not; the float scale of their products
    (or two: values 0-15 and 16-31, Q6_K's sub-blocks); the factor of the activations' group sum (a
    minimum, or -offset x scale), if any."""

    values: object
    signed: bool
    scale: object
    scale_hi: object = None
    sum_factor: object = None


@dataclass(frozen=True)
class Layout:
    name: str
    block_bytes: int
    groups: int                                          # groups of 32 values per block
    emit: Callable[[Emitter, object], list[Group]]      # (emitter, block's byte offset) -> its groups


def _neg(e, x, k: float):
    return e.b.fmul(x, ir.Constant(F32, -k))


def _q4_0(e, o):
    d = e.f16(o)
    return [Group(e.nibbles16(e.b.add(o, _i64(2))), False, d, sum_factor=_neg(e, d, 8.0))]


def _q4_1(e, o):
    return [Group(e.nibbles16(e.b.add(o, _i64(4))), False, e.f16(o), sum_factor=e.f16(e.b.add(o, _i64(2))))]


def _q5(e, o, with_min: bool):
    b = e.b
    qh, qs = (4, 8) if with_min else (2, 6)
    values = b.or_(e.nibbles16(b.add(o, _i64(qs))), e.high_bits(b.add(o, _i64(qh))))
    d = e.f16(o)
    return [Group(values, False, d, sum_factor=e.f16(b.add(o, _i64(2))) if with_min else _neg(e, d, 16.0))]


def _q8_0(e, o):
    return [Group(e.bytes32(e.b.add(o, _i64(2))), True, e.f16(o))]


def _q4_k(e, o):
    """d, dmin, 12 bytes of 6-bit scales and minimums (ggml's get_scale_min_k4), 128 bytes of nibbles:
    bytes 32j..32j+31 hold group 2j in their low nibbles and group 2j+1 in their high ones."""
    return _q4_k_like(e, o, 16)


def _q4_k_like(e, o, nibbles_at: int):
    b = e.b
    d, dmin = e.f16(o), e.f16(b.add(o, _i64(2)))
    q = [e.byte(b.add(o, _i64(4 + i))) for i in range(12)]

    def scale_min(j: int):
        if j < 4:
            return b.and_(q[j], _i32(63)), b.and_(q[j + 4], _i32(63))
        sc = b.or_(b.and_(q[j + 4], _i32(15)), b.shl(b.lshr(q[j - 4], _i32(6)), _i32(4)))
        mn = b.or_(b.lshr(q[j + 4], _i32(4)), b.shl(b.lshr(q[j], _i32(6)), _i32(4)))
        return sc, mn

    groups = []
    for j in range(4):
        raw = e.bytes32(b.add(o, _i64(nibbles_at + 32 * j)))
        halves = (b.and_(raw, _const_vec(I8, [15] * 32)), b.lshr(raw, _const_vec(I8, [4] * 32)))
        for h, values in enumerate(halves):
            sc, mn = scale_min(2 * j + h)
            groups.append(Group(values, False, b.fmul(d, b.uitofp(sc, F32)),
                                sum_factor=b.fmul(b.fneg(dmin), b.uitofp(mn, F32))))
    return groups


def _q6_k(e, o):
    """128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales (one per 16 values), d. Two
    halves of 128 values, four groups of 32 each (ggml's dequantize_row_q6_K: q1..q4)."""
    b = e.b
    d = e.f16(b.add(o, _i64(208)))
    groups = []
    for h in range(2):
        qh = e.bytes32(b.add(o, _i64(128 + 32 * h)))
        for k in range(4):
            ql = e.bytes32(b.add(o, _i64(64 * h + (32 if k % 2 else 0))))
            low = b.lshr(ql, _const_vec(I8, [4] * 32)) if k >= 2 else b.and_(ql, _const_vec(I8, [15] * 32))
            top = b.shl(b.and_(b.lshr(qh, _const_vec(I8, [2 * k] * 32)), _const_vec(I8, [3] * 32)),
                        _const_vec(I8, [4] * 32))
            values = b.sub(b.or_(low, top), _const_vec(I8, [32] * 32))
            sc = 192 + 8 * h + 2 * k
            lo_scale = b.fmul(d, b.sitofp(e.sbyte(b.add(o, _i64(sc))), F32))
            hi_scale = b.fmul(d, b.sitofp(e.sbyte(b.add(o, _i64(sc + 1))), F32))
            groups.append(Group(values, True, lo_scale, scale_hi=hi_scale))
    return groups


def _q5_k(e, o):
    """d, dmin, Q4_K's 12 bytes of scales and minimums, 32 bytes of fifth bits (bit 2j and 2j+1 of byte l:
    value l of groups 2j and 2j+1), 128 bytes of nibbles as Q4_K's."""
    b = e.b
    groups = _q4_k_like(e, o, 48)
    hb = e.bytes32(b.add(o, _i64(16)))
    for gi, g in enumerate(groups):
        bit = b.shl(b.and_(b.lshr(hb, _const_vec(I8, [gi] * 32)), _const_vec(I8, [1] * 32)), _const_vec(I8, [4] * 32))
        g.values = b.or_(g.values, bit)
    return groups


def _q3_k(e, o):
    """32 bytes of high bits (hmask), 64 of 2-bit values, 12 bytes of sixteen 6-bit scales, d (ggml's
    dequantize_row_q3_K): two halves of 128 values, four groups of 32 each; group j of half n reads bits
    2j of bytes 32n..32n+31 and bit 4n + j of the high bits, value (2 bits) - (4 where that bit is clear),
    its two halves of 16 scaled by scales 8n + 2j and 8n + 2j + 1, each d x (scale - 32)."""
    b = e.b
    d = e.f16(b.add(o, _i64(108)))
    sb = [e.byte(b.add(o, _i64(96 + i))) for i in range(12)]

    def scale(s: int):
        t, part = s % 4, s // 4
        low = b.and_(b.lshr(sb[t + 4 * (part % 2)], _i32(4 * (part // 2))), _i32(15))
        high = b.and_(b.lshr(sb[8 + t], _i32(2 * part)), _i32(3))
        return b.fmul(d, b.sitofp(b.sub(b.or_(low, b.shl(high, _i32(4))), _i32(32)), F32))

    hm = e.bytes32(o)
    groups = []
    for n in range(2):
        q = e.bytes32(b.add(o, _i64(32 + 32 * n)))
        for j in range(4):
            two = b.and_(b.lshr(q, _const_vec(I8, [2 * j] * 32)), _const_vec(I8, [3] * 32))
            bit = b.and_(hm, _const_vec(I8, [1 << (4 * n + j)] * 32))
            clear = b.icmp_unsigned("==", bit, ir.Constant(V32I8, None))
            values = b.sub(two, b.select(clear, _const_vec(I8, [4] * 32), ir.Constant(V32I8, None)))
            groups.append(Group(values, True, scale(8 * n + 2 * j), scale_hi=scale(8 * n + 2 * j + 1)))
    return groups


KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _iq4_values(e, offset):
    """16 bytes of nibbles (low ones elements 0-15, high ones 16-31) through IQ4_NL's table (signed bytes)."""
    shuffle = _declare(e.b, "llvm.x86.avx2.pshuf.b", V32I8, [V32I8, V32I8])
    table = _const_vec(I8, [v & 255 for v in KVALUES_IQ4NL] * 2)
    return e.b.call(shuffle, [table, e.nibbles16(offset)])


def _iq4_nl(e, o):
    return [Group(_iq4_values(e, e.b.add(o, _i64(2))), True, e.f16(o))]


def _iq4_xs(e, o):
    """d, 16 bits of the scales' high parts (2 per group), 4 bytes of their low nibbles, 128 bytes of nibbles
    (16 per group, as IQ4_NL's): group ib's scale is d x (its 6-bit scale - 32)."""
    b = e.b
    d = e.f16(o)
    high = b.zext(e.load(e.row, b.add(o, _i64(2)), I16), I32)
    groups = []
    for ib in range(8):
        low = b.and_(b.lshr(e.byte(b.add(o, _i64(4 + ib // 2))), _i32(4 * (ib % 2))), _i32(15))
        ls = b.or_(low, b.shl(b.and_(b.lshr(high, _i32(2 * ib)), _i32(3)), _i32(4)))
        scale = b.fmul(d, b.sitofp(b.sub(ls, _i32(32)), F32))
        groups.append(Group(_iq4_values(e, b.add(o, _i64(8 + 16 * ib))), True, scale))
    return groups


def _i64(v: int):
    return ir.Constant(I64, v)


def _i32(v: int):
    return ir.Constant(I32, v)


LAYOUTS = {
    "Q4_0": Layout("Q4_0", 18, 1, _q4_0),
    "Q4_1": Layout("Q4_1", 20, 1, _q4_1),
    "Q5_0": Layout("Q5_0", 22, 1, lambda e, o: _q5(e, o, False)),
    "Q5_1": Layout("Q5_1", 24, 1, lambda e, o: _q5(e, o, True)),
    "Q8_0": Layout("Q8_0", 34, 1, _q8_0),
    "Q4_K": Layout("Q4_K", 144, 8, _q4_k),
    "Q6_K": Layout("Q6_K", 210, 8, _q6_k),
    "Q5_K": Layout("Q5_K", 176, 8, _q5_k),
    "Q3_K": Layout("Q3_K", 110, 8, _q3_k),
    "IQ4_NL": Layout("IQ4_NL", 18, 1, _iq4_nl),
    "IQ4_XS": Layout("IQ4_XS", 136, 8, _iq4_xs),
}


def _reduce(builder, v):
    """The eight lanes summed in order (no reassociation: the same float result on every instruction set)."""
    fn = _declare(builder, "llvm.vector.reduce.fadd.v8f32", F32, [F32, V8F32])
    return builder.call(fn, [ir.Constant(F32, 0.0), v])


def row_dot(layout: Layout, n_x: int):
    """An intrinsic ``(row, xq, xd, xsum, m) -> UniTuple(float32, n_x)``: weight row ``row`` (uint8, its
    blocks) times activation rows m .. m + n_x - 1 of (xq int8 (M, K), xd float32 (M, K/32) scales,
    xsum float32 (M, K/32): each group's sum, scale included). The weight bytes are unpacked once per
    block for all n_x rows."""

    @intrinsic
    def dot(typingctx, row, xq, xd, xsum, m):
        sig = types.UniTuple(types.float32, n_x)(row, xq, xd, xsum, m)

        def codegen(context, builder, signature, args):
            arow, axq, axd, axs = (context.make_array(t)(context, builder, a)
                                   for t, a in zip(signature.args[:4], args[:4]))
            m0 = context.cast(builder, args[4], signature.args[4], types.int64)
            k = cgutils.unpack_tuple(builder, axq.shape, 2)[1]
            n_groups = cgutils.unpack_tuple(builder, axd.shape, 2)[1]
            isa = product_isa(context)
            e = Emitter(builder, isa, arow.data)
            xs = [builder.add(m0, _i64(i)) for i in range(n_x)]
            x_base = [builder.mul(r, k) for r in xs]           # element offsets of the activation rows
            s_base = [builder.mul(r, n_groups) for r in xs]
            acc = [cgutils.alloca_once_value(builder, ir.Constant(V8F32, None)) for _ in range(n_x)]
            acc_sum = [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(n_x)]
            n_blocks = builder.udiv(n_groups, _i64(layout.groups))
            with cgutils.for_range(builder, n_blocks) as loop:
                blk = loop.index
                for gi, g in enumerate(layout.emit(e, builder.mul(blk, _i64(layout.block_bytes)))):
                    group = builder.add(builder.mul(blk, _i64(layout.groups)), _i64(gi))
                    for i in range(n_x):
                        x = e.load(axq.data, builder.add(x_base[i], builder.mul(group, _i64(QK))), V32I8)
                        lanes = builder.sitofp(e.sdot(g.values, x) if g.signed else e.dot(g.values, x), V8F32)
                        at = builder.add(s_base[i], group)
                        dx = builder.load(builder.gep(axd.data, [at]))
                        scale = _splat(builder, builder.fmul(g.scale, dx), 8)
                        if g.scale_hi is not None:
                            hi = _splat(builder, builder.fmul(g.scale_hi, dx), 8)
                            scale = builder.shuffle_vector(scale, hi, _const_vec(I32, [0, 1, 2, 3, 12, 13, 14, 15]))
                        builder.store(builder.fadd(builder.load(acc[i]), builder.fmul(lanes, scale)), acc[i])
                        if g.sum_factor is not None:
                            xsum_at = builder.load(builder.gep(axs.data, [at]))
                            builder.store(builder.fadd(builder.load(acc_sum[i]), builder.fmul(g.sum_factor, xsum_at)),
                                          acc_sum[i])
            outs = [builder.fadd(_reduce(builder, builder.load(acc[i])), builder.load(acc_sum[i])) for i in range(n_x)]
            return context.make_tuple(builder, signature.return_type, outs)

        return sig, codegen

    return dot


# -- many activation rows: each weight row unpacked once, then a tile of weight rows by activation rows ---
# A prefill chunk multiplies every weight row by many activation rows. row_dot would unpack a row's blocks
# again for every few activation rows (Q5_0's fifth bits cost more than the products), so a batch first
# unpacks TILE_R weight rows into scratch (``unpack_row``: each group's 32 bytes, for signed types their
# magnitudes too, its 8-lane scale vector and its group-sum factor) and then multiplies that tile by
# TILE_M activation rows at a time (``tile_dot``), each group's values and scales loaded once for the
# whole tile. Every output runs the same float operations in the same order as row_dot's (the integer
# lanes, converted, times the scale vector, added to eight running lanes; the group-sum term in its own
# running sum; the lanes summed in order, then that sum added): a row of a batch is the bits of that
# row alone.
TILE_R, TILE_M = 4, 4


def signed_of(layout: Layout) -> bool:
    return layout.name in SIGNED


def has_sum_of(layout: Layout) -> bool:
    return layout.name not in NO_SUM


SIGNED = frozenset(("Q8_0", "Q6_K", "Q3_K", "IQ4_NL", "IQ4_XS"))   # values are signed bytes (the sign trick)
NO_SUM = SIGNED                                           # no minimum or offset (no group-sum term)


def unpack_row(layout: Layout):
    """An intrinsic ``(row, slot, wq, wa, ws, wsf) -> int64``: weight row ``row`` (uint8, its blocks) into
    slot ``slot`` of a tile's scratch: wq int8 (TILE_R, K) its values, wa int8 (TILE_R, K) their
    magnitudes (signed types), ws float32 (TILE_R, K/32 * 8) each group's scale in 8 lanes (lanes 4-7
    from the second scale where a group has two), wsf float32 (K/32, TILE_R) each group's sum factor."""
    signed, with_sum = signed_of(layout), has_sum_of(layout)

    @intrinsic
    def unpack(typingctx, row, slot, wq, wa, ws, wsf):
        sig = types.int64(row, slot, wq, wa, ws, wsf)

        def codegen(context, builder, signature, args):
            types_, values = (signature.args[0], *signature.args[2:]), (args[0], *args[2:])
            arow, awq, awa, aws, awsf = (context.make_array(t)(context, builder, a) for t, a in zip(types_, values))
            j = context.cast(builder, args[1], signature.args[1], types.int64)
            k = cgutils.unpack_tuple(builder, awq.shape, 2)[1]
            n_groups = builder.udiv(k, _i64(QK))
            tile_r = cgutils.unpack_tuple(builder, awsf.shape, 2)[1]
            e = Emitter(builder, isa_of(context) or "avx2", arow.data)
            q_base, s_base = builder.mul(j, k), builder.mul(j, builder.mul(n_groups, _i64(8)))
            n_blocks = builder.udiv(n_groups, _i64(layout.groups))
            with cgutils.for_range(builder, n_blocks) as loop:
                blk = loop.index
                for gi, g in enumerate(layout.emit(e, builder.mul(blk, _i64(layout.block_bytes)))):
                    group = builder.add(builder.mul(blk, _i64(layout.groups)), _i64(gi))
                    at = builder.add(q_base, builder.mul(group, _i64(QK)))
                    builder.store(g.values, e.ptr(awq.data, at, V32I8), align=1)
                    if signed:
                        sign = _declare(builder, "llvm.x86.avx2.psign.b", V32I8, [V32I8, V32I8])
                        builder.store(builder.call(sign, [g.values, g.values]), e.ptr(awa.data, at, V32I8), align=1)
                    scale = _splat(builder, g.scale, 8)
                    if g.scale_hi is not None:
                        hi = _splat(builder, g.scale_hi, 8)
                        scale = builder.shuffle_vector(scale, hi, _const_vec(I32, [0, 1, 2, 3, 12, 13, 14, 15]))
                    builder.store(scale, e.ptr(aws.data, builder.add(s_base, builder.mul(group, _i64(8))), V8F32),
                                  align=4)
                    if with_sum:
                        at = builder.add(builder.mul(group, tile_r), j)
                        builder.store(g.sum_factor, builder.gep(awsf.data, [at]))
            return ir.Constant(I64, 0)

        return sig, codegen

    return unpack


def tile_dot(signed: bool, with_sum: bool, n_w: int, n_x: int):
    """An intrinsic ``(wq, wa, ws, wsf, xq, xd, xsum, m) -> UniTuple(float32, n_x * n_w)``: the first n_w
    rows of a tile's scratch (unpack_row) times activation rows m .. m + n_x - 1; element i * n_w + j is
    activation row m + i times weight row j."""

    @intrinsic
    def dot(typingctx, wq, wa, ws, wsf, xq, xd, xsum, m):
        sig = types.UniTuple(types.float32, n_x * n_w)(wq, wa, ws, wsf, xq, xd, xsum, m)

        def codegen(context, builder, signature, args):
            awq, awa, aws, awsf, axq, axd, axs = (context.make_array(t)(context, builder, a)
                                                  for t, a in zip(signature.args[:7], args[:7]))
            b = builder
            m0 = context.cast(b, args[7], signature.args[7], types.int64)
            k = cgutils.unpack_tuple(b, axq.shape, 2)[1]
            n_groups = cgutils.unpack_tuple(b, axd.shape, 2)[1]
            tile_r = cgutils.unpack_tuple(b, awsf.shape, 2)[1]
            isa = product_isa(context)
            e = Emitter(b, isa, None)
            x_rows = [b.add(m0, _i64(i)) for i in range(n_x)]
            x_base = [b.mul(r, k) for r in x_rows]
            d_base = [b.mul(r, n_groups) for r in x_rows]
            w_base = [b.mul(_i64(j), k) for j in range(n_w)]
            s_base = [b.mul(_i64(j), b.mul(n_groups, _i64(8))) for j in range(n_w)]
            zero_sum = ir.Constant(ir.VectorType(F32, n_w), None)
            acc = [[cgutils.alloca_once_value(b, ir.Constant(V8F32, None)) for _ in range(n_w)] for _ in range(n_x)]
            acc_sum = [cgutils.alloca_once_value(b, zero_sum) for _ in range(n_x)]
            sign = _declare(b, "llvm.x86.avx2.psign.b", V32I8, [V32I8, V32I8])
            with cgutils.for_range(b, n_groups) as loop:
                group = loop.index
                goff = b.mul(group, _i64(QK))
                w = [e.load(awq.data, b.add(w_base[j], goff), V32I8) for j in range(n_w)]
                wabs = [e.load(awa.data, b.add(w_base[j], goff), V32I8) for j in range(n_w)] if signed else w
                wsc = [b.load(e.ptr(aws.data, b.add(s_base[j], b.mul(group, _i64(8))), V8F32), align=4)
                       for j in range(n_w)]
                if with_sum:
                    wsf = b.load(e.ptr(awsf.data, b.mul(group, tile_r), ir.VectorType(F32, n_w)), align=4)
                for i in range(n_x):
                    x = e.load(axq.data, b.add(x_base[i], goff), V32I8)
                    at = b.add(d_base[i], group)
                    dx = _splat(b, b.load(b.gep(axd.data, [at])), 8)
                    for j in range(n_w):
                        xs = b.call(sign, [x, w[j]]) if signed else x
                        lanes = b.sitofp(e.dot(wabs[j], xs), V8F32)
                        b.store(b.fadd(b.load(acc[i][j]), b.fmul(lanes, b.fmul(wsc[j], dx))), acc[i][j])
                    if with_sum:
                        xsum_at = _splat(b, b.load(b.gep(axs.data, [at])), n_w)
                        b.store(b.fadd(b.load(acc_sum[i]), b.fmul(wsf, xsum_at)), acc_sum[i])
            outs = []
            for i in range(n_x):
                sums = b.load(acc_sum[i])
                for j in range(n_w):
                    outs.append(b.fadd(_reduce(b, b.load(acc[i][j])), b.extract_element(sums, _i32(j))))
            return context.make_tuple(b, signature.return_type, outs)

        return sig, codegen

    return dot


def rows_dot(layout: Layout, n_w: int):
    """An intrinsic ``(w, r, xq, xd, xsum, m) -> UniTuple(float32, n_w)``: weight rows r .. r + n_w - 1 of w
    (uint8 (N, bytes per row)) times activation row m, each block unpacked in registers: for a decode step,
    where each weight row is read once. The n_w rows' running sums are independent chains (a one-row loop
    waits on its float additions); each output runs row_dot's operations in row_dot's order."""

    @intrinsic
    def dot(typingctx, w, r, xq, xd, xsum, m):
        sig = types.UniTuple(types.float32, n_w)(w, r, xq, xd, xsum, m)

        def codegen(context, builder, signature, args):
            b = builder
            aw, axq, axd, axs = (context.make_array(t)(context, b, a)
                                 for t, a in zip((signature.args[0], *signature.args[2:5]), (args[0], *args[2:5])))
            r0 = context.cast(b, args[1], signature.args[1], types.int64)
            m0 = context.cast(b, args[5], signature.args[5], types.int64)
            row_bytes = cgutils.unpack_tuple(b, aw.shape, 2)[1]
            k = cgutils.unpack_tuple(b, axq.shape, 2)[1]
            n_groups = cgutils.unpack_tuple(b, axd.shape, 2)[1]
            isa = product_isa(context)
            rows = [b.gep(aw.data, [b.mul(b.add(r0, _i64(j)), row_bytes)]) for j in range(n_w)]
            es = [Emitter(b, isa, p) for p in rows]
            x_base, s_base = b.mul(m0, k), b.mul(m0, n_groups)
            acc = [cgutils.alloca_once_value(b, ir.Constant(V8F32, None)) for _ in range(n_w)]
            acc_sum = [cgutils.alloca_once_value(b, ir.Constant(F32, 0.0)) for _ in range(n_w)]
            n_blocks = b.udiv(n_groups, _i64(layout.groups))
            with cgutils.for_range(b, n_blocks) as loop:
                blk = loop.index
                per_row = [layout.emit(e, b.mul(blk, _i64(layout.block_bytes))) for e in es]
                for gi in range(layout.groups):
                    group = b.add(b.mul(blk, _i64(layout.groups)), _i64(gi))
                    x = es[0].load(axq.data, b.add(x_base, b.mul(group, _i64(QK))), V32I8)
                    at = b.add(s_base, group)
                    dx = b.load(b.gep(axd.data, [at]))
                    xsum_at = b.load(b.gep(axs.data, [at])) if layout.name not in NO_SUM else None
                    for j in range(n_w):
                        g = per_row[j][gi]
                        lanes = b.sitofp(es[j].sdot(g.values, x) if g.signed else es[j].dot(g.values, x), V8F32)
                        scale = _splat(b, b.fmul(g.scale, dx), 8)
                        if g.scale_hi is not None:
                            hi = _splat(b, b.fmul(g.scale_hi, dx), 8)
                            scale = b.shuffle_vector(scale, hi, _const_vec(I32, [0, 1, 2, 3, 12, 13, 14, 15]))
                        b.store(b.fadd(b.load(acc[j]), b.fmul(lanes, scale)), acc[j])
                        if g.sum_factor is not None:
                            b.store(b.fadd(b.load(acc_sum[j]), b.fmul(g.sum_factor, xsum_at)), acc_sum[j])
            outs = [b.fadd(_reduce(b, b.load(acc[j])), b.load(acc_sum[j])) for j in range(n_w)]
            return context.make_tuple(b, signature.return_type, outs)

        return sig, codegen

    return dot
