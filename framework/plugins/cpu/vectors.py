"""The inner loops of the quantized products (quantized.py), written as LLVM vector IR through numba
intrinsics.

A row's product is a sum over its blocks of (weight scale) x (activation scale) x (integer dot product
of the block's 32 weights and 32 activations). Numba's loop vectorizer does not find that shape (it
unrolls the 32-element loop and vectorizes nothing), so the loops are written here: each group's integer
products are summed exactly in int32 lanes by the CPU's product of unsigned bytes by signed ones,

* ``vnni``: AVX-512 VNNI's ``vpdpbusd`` (32 byte products into 8 lanes, added to them, one instruction);
* ``avx2``: AVX2's ``vpmaddubsw`` then ``vpmaddwd`` (pairs into int16, then into int32), then an add;

and each output then runs one float chain over its groups (see "the arithmetic every product shares"
below): a decode step's products hold a weight row's 32 values in a vector's lanes and gather eight
rows' group sums into one vector; from two activation rows the products turn eight weight rows a row a
lane in registers, and a batch's tile holds them so in scratch, both broadcasting the activations; all
give the same integers and then the same float operations.

The path is chosen from the features numba compiles for (its codegen's target, the host CPU unless
NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say otherwise), so a kernel cached on disk always matches the path
it was built with. The two paths compute the same integers, and the float arithmetic around them is
plain IEEE in a fixed order (no fast-math; the multiply-adds are explicit fused ones, llvm.fma, one
rounding on every CPU; no other contraction), so a product's result is the same bit for bit whichever
path, CPU or thread count computed it. A CPU without AVX2 has neither path (``isa_of`` says so and the
plugin keeps the float32 products). Signed weights (Q8_0, Q6_K, Q3_K, IQ4_NL, IQ4_XS) go through the sign
trick of ggml's AVX2 code: |w| times x with w's sign. The unsigned operand never exceeds 128 (|w| <= 128,
unsigned values <= 63), so the int16 pairs of ``vpmaddubsw`` cannot saturate (2 x 128 x 127 < 32768).

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
    # (emitter of row a, of row b, block's byte offset) -> (values 0-15 of a then of b, values 16-31 of a then
    # of b), two <32 x i8>: for the one-group types of 4 or 5 bits, whose 32 values fit in 16 bytes, so that
    # a decode step's product takes two rows a vector (rows_dot)
    pair: Callable[[Emitter, Emitter, object], tuple] | None = None
    # the one-group types' first four bytes: ('d', None) a float16 scale, ('d', k) also a sum factor of -k x
    # the scale, ('dm', None) a scale and a float16 sum factor (the minimum): what ``emit`` reads there, read
    # for eight rows at once (rows_dot)
    head: tuple | None = None
    # the K-quants' scales of a block for eight rows at once, a row a lane: (row 0's pointer, bytes a row, the
    # block's byte offset) -> for each group (scale, second scale or None, sum factor or None) as <8 x float>,
    # the values ``emit`` computes for each row, by the same operations (rows_dot; unpacking the 6-bit
    # scales row by row in scalar code took more of a Q4_K product's time than its integer products)
    scales8: Callable | None = None
    interleaved: bool = False                            # the weight held so (interleave): rows_dot's lanes always


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


def _nibble_pair(ea, eb, o, qs: int):
    """Two rows' 16 bytes of nibbles at block offset o + qs as (low nibbles of a, of b), (high ones of a, of b)."""
    b = ea.b
    v = b.shuffle_vector(ea.load(ea.row, b.add(o, _i64(qs)), ir.VectorType(I8, 16)),
                         eb.load(eb.row, b.add(o, _i64(qs)), ir.VectorType(I8, 16)), _const_vec(I32, range(32)))
    return b.and_(v, _const_vec(I8, [15] * 32)), b.lshr(v, _const_vec(I8, [4] * 32))


def _q4_pair(qs: int):
    return lambda ea, eb, o: _nibble_pair(ea, eb, o, qs)


def _q5_pair(qh: int, qs: int):
    """As _nibble_pair, each value's fifth bit (bit i of the block's uint32 at qh, for value i) times 16 added
    as high_bits adds it: the two rows' four bytes side by side, each spread to 8 lanes and tested."""
    def pair(ea, eb, o):
        b = ea.b
        lo, hi = _nibble_pair(ea, eb, o, qs)
        v4 = ir.VectorType(I8, 4)
        words = b.shuffle_vector(b.bitcast(ea.load(ea.row, b.add(o, _i64(qh)), I32), v4),
                                 b.bitcast(eb.load(eb.row, b.add(o, _i64(qh)), I32), v4), _const_vec(I32, range(8)))
        bit = _const_vec(I8, [1 << (i % 8) for i in range(32)])
        out = []
        for first, values in ((0, lo), (2, hi)):          # bytes 0-1 of a word hold bits 0-15, bytes 2-3 bits 16-31
            spread = b.shuffle_vector(words, ir.Constant(ir.VectorType(I8, 8), ir.Undefined),
                                      _const_vec(I32, [first + i // 8 for i in range(16)]
                                                 + [4 + first + i // 8 for i in range(16)]))
            is_set = b.icmp_unsigned("!=", b.and_(spread, bit), ir.Constant(V32I8, None))
            out.append(b.or_(values, b.select(is_set, _const_vec(I8, [16] * 32), ir.Constant(V32I8, None))))
        return tuple(out)
    return pair


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


def _words8(b, row0, row_bytes, offset, at: int, n: int):
    """The n 32-bit words from byte offset + at of eight rows, rows row_bytes apart: n <8 x i32>, a row a lane
    (row_bytes None: the rows held interleaved, a load a word)."""
    if row_bytes is None:
        base = b.gep(row0, [b.mul(b.add(offset, _i64(at)), _i64(8))])
        return [b.load(b.bitcast(b.gep(base, [_i64(32 * w)]), V8I32.as_pointer()), align=1) for w in range(n)]
    base = b.gep(row0, [b.add(offset, _i64(at))])
    return [_vector_of(b, [b.load(b.bitcast(b.gep(base, [b.add(b.mul(row_bytes, _i64(j)), _i64(4 * w))]),
                                            I32.as_pointer()), align=1) for j in range(8)]) for w in range(n)]


def _f16_lanes(b, words, high: bool):
    """The float16 in the low (or high) half of each lane of <8 x i32>, widened to <8 x float>."""
    v = b.lshr(words, _const_vec(I32, [16] * 8)) if high else words
    return b.fpext(b.bitcast(b.trunc(v, ir.VectorType(I16, 8)), ir.VectorType(F16, 8)), V8F32)


def _byte_lanes(b, words, i: int, signed: bool = False):
    """Byte i of the words (words[i // 4], byte i % 4 of each lane) as <8 x i32>, zero- or sign-extended."""
    w = words[i // 4]
    if signed:
        return b.ashr(b.shl(w, _const_vec(I32, [24 - 8 * (i % 4)] * 8)), _const_vec(I32, [24] * 8))
    return b.and_(b.lshr(w, _const_vec(I32, [8 * (i % 4)] * 8)), _const_vec(I32, [255] * 8))


def _q4_k_scales8(b, row0, row_bytes, offset):
    """scales8 of Q4_K and Q5_K: _q4_k_like's scales and minimums, a row a lane."""
    head, *words = _words8(b, row0, row_bytes, offset, 0, 4)
    d, dmin = _f16_lanes(b, head, False), _f16_lanes(b, head, True)
    q = [_byte_lanes(b, words, i) for i in range(12)]

    def c(v):
        return _const_vec(I32, [v] * 8)

    out = []
    for j in range(8):
        if j < 4:
            sc, mn = b.and_(q[j], c(63)), b.and_(q[j + 4], c(63))
        else:
            sc = b.or_(b.and_(q[j + 4], c(15)), b.shl(b.lshr(q[j - 4], c(6)), c(4)))
            mn = b.or_(b.lshr(q[j + 4], c(4)), b.shl(b.lshr(q[j], c(6)), c(4)))
        out.append((b.fmul(d, b.uitofp(sc, V8F32)), None, b.fmul(b.fneg(dmin), b.uitofp(mn, V8F32))))
    return out


def _q6_k_scales8(b, row0, row_bytes, offset):
    """scales8 of Q6_K: d x (int8 scale) for values 0-15 and 16-31 of each group, a row a lane."""
    words = _words8(b, row0, row_bytes, offset, 192, 4)
    at = b.add(offset, _i64(208))
    d = _vector_of(b, [b.fpext(b.load(b.bitcast(b.gep(row0, [b.add(b.mul(row_bytes, _i64(j)), at)]),
                                                F16.as_pointer()), align=1), F32) for j in range(8)])
    out = []
    for h in range(2):
        for k in range(4):
            sc = 8 * h + 2 * k
            lo, hi = (b.fmul(d, b.sitofp(_byte_lanes(b, words, i, signed=True), V8F32)) for i in (sc, sc + 1))
            out.append((lo, hi, None))
    return out


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
    "Q4_0": Layout("Q4_0", 18, 1, _q4_0, _q4_pair(2), ("d", 8.0)),
    "Q4_1": Layout("Q4_1", 20, 1, _q4_1, _q4_pair(4), ("dm", None)),
    "Q5_0": Layout("Q5_0", 22, 1, lambda e, o: _q5(e, o, False), _q5_pair(2, 6), ("d", 16.0)),
    "Q5_1": Layout("Q5_1", 24, 1, lambda e, o: _q5(e, o, True), _q5_pair(4, 8), ("dm", None)),
    "Q8_0": Layout("Q8_0", 34, 1, _q8_0, head=("d", None)),
    "Q4_K": Layout("Q4_K", 144, 8, _q4_k, scales8=_q4_k_scales8),
    "Q6_K": Layout("Q6_K", 210, 8, _q6_k, scales8=_q6_k_scales8),
    "Q5_K": Layout("Q5_K", 176, 8, _q5_k, scales8=_q4_k_scales8),
    "Q3_K": Layout("Q3_K", 110, 8, _q3_k),
    "IQ4_NL": Layout("IQ4_NL", 18, 1, _iq4_nl, head=("d", None)),
    "IQ4_XS": Layout("IQ4_XS", 136, 8, _iq4_xs),
}


# -- the arithmetic every product shares ----------------------------------------------------------------
# An output is one float chain over its groups of 32 values, in order: the group's integer dot product
# (exact, whichever instructions and lanes summed it), times (weight scale x activation scale), added by a
# fused multiply-add (llvm.fma: one rounding, the same on every CPU and in every lane); a group with two
# scales (Q6_K, Q3_K: values 0-15 and 16-31) adds two such terms, the lower half first; a type with a
# minimum or an offset then adds (its factor x the activations' group sum) by another. It is ggml's
# scalar order (sumf += sumi * d per block), so the products below may lay the integers out however
# suits them: a batch's tile (weight rows in the lanes) and a decode step's rows (values in the lanes)
# give the same bits.
TILE_R = 8    # weight rows in a tile: the eight int32 lanes of one vector
TILE_M = 4    # activation rows a tile multiplies at a time

SIGNED = frozenset(("Q8_0", "Q6_K", "Q3_K", "IQ4_NL", "IQ4_XS"))   # values are signed bytes (the sign trick)
NO_SUM = SIGNED                                           # no minimum or offset (no group-sum term)
TWO_SCALES = frozenset(("Q6_K", "Q3_K"))                  # a scale per 16 values
# a tile's variants, by (signed values, group-sum term, two scales a group); kind_of(layout) indexes them
KINDS = ((False, True, False), (True, False, False), (True, False, True))


def kind_of(layout: Layout) -> int:
    return KINDS.index((layout.name in SIGNED, layout.name not in NO_SUM, layout.name in TWO_SCALES))


def _fma(b, x, y, z):
    ty = x.type
    name = f"llvm.fma.v{ty.count}f32" if isinstance(ty, ir.VectorType) else "llvm.fma.f32"
    return b.call(_declare(b, name, ty, [ty, ty, ty]), [x, y, z])


def _psign(b, x, w):
    return b.call(_declare(b, "llvm.x86.avx2.psign.b", V32I8, [V32I8, V32I8]), [x, w])


def _dot_acc(e: Emitter, acc, u, s):
    """acc + e.dot(u, s), in one instruction where the CPU has VNNI."""
    b = e.b
    if e.isa == "vnni":
        fn = _declare(b, "llvm.x86.avx512.vpdpbusd.256", V8I32, [V8I32, V8I32, V8I32])
        return b.call(fn, [acc, b.bitcast(u, V8I32), b.bitcast(s, V8I32)])
    return b.add(acc, e.dot(u, s))


def _group_dot(e: Emitter, g: Group, x):
    """<8 x i32>: lane j the sum of products of values 4j..4j+3 of group g and of x."""
    return e.sdot(g.values, x) if g.signed else e.dot(g.values, x)


def _vector_of(b, scalars):
    v = ir.Constant(ir.VectorType(scalars[0].type, len(scalars)), ir.Undefined)
    for j, s in enumerate(scalars):
        v = b.insert_element(v, s, _i32(j))
    return v


def _halves_by_row(b, vs):
    """(lo, hi) <8 x i32> of eight rows' <8 x i32> lane sums: lane j of lo is the sum of lanes 0-3 (values
    0-15) of vs[j], of hi of lanes 4-7. Integer additions: exact, in any order."""
    def pair(u, v, first, second):
        return b.add(b.shuffle_vector(u, v, _const_vec(I32, first)), b.shuffle_vector(u, v, _const_vec(I32, second)))
    p = [pair(vs[2 * t], vs[2 * t + 1], [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15]) for t in range(4)]
    q = [pair(p[2 * t], p[2 * t + 1], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]) for t in range(2)]
    return (b.shuffle_vector(q[0], q[1], _const_vec(I32, [0, 1, 2, 3, 8, 9, 10, 11])),
            b.shuffle_vector(q[0], q[1], _const_vec(I32, [4, 5, 6, 7, 12, 13, 14, 15])))


def _hadd(b, u, v):
    """<8 x i32> [u0+u1, u2+u3, v0+v1, v2+v3, u4+u5, u6+u7, v4+v5, v6+v7] (vphaddd's order)."""
    return b.add(b.shuffle_vector(u, v, _const_vec(I32, [0, 2, 8, 10, 4, 6, 12, 14])),
                 b.shuffle_vector(u, v, _const_vec(I32, [1, 3, 9, 11, 5, 7, 13, 15])))


PREFETCH_CHUNKS = 2      # how many 8-row chunks ahead a decode step's product asks for the weight's bytes


def _prefetch_next(b, row0, row_bytes, blk, block_bytes: int):
    """Ask the memory for the bytes the product will read PREFETCH_CHUNKS chunks of eight rows later, as far
    into them as this chunk has come (block blk of each row): eight rows are contiguous, so that is one
    stretch of 8 x block_bytes a block. A decode step reads each weight byte once, from memory: the
    hardware's own prefetch, which follows eight streams a row apart, stays too close behind (worst on short
    rows: the 1.5B's K-quant rows of 864 bytes read 5.3-5.8 GB/s cold without it, 7.7-8.4 with it, one
    thread; benchmarks/results/cpu_cold_prefetch_kquants-2026-12-06.log)."""
    ahead = b.add(b.mul(row_bytes, _i64(PREFETCH_CHUNKS * TILE_R)), b.mul(blk, _i64(TILE_R * block_bytes)))
    for line in range(0, TILE_R * block_bytes, 64):
        _prefetch(b, b.gep(row0, [b.add(ahead, _i64(line))]))


def _prefetch(b, at):
    """Ask for the cache line holding byte pointer ``at`` (a hint, which changes no result) with locality 1,
    prefetcht2: into the outer caches, not L1. With prefetcht0 (locality 3) a decode step's products ran up to
    half as fast cold: the 1.5B's layer products 57-62 -> 39-42 ms a pass at one thread, Q6_K 18-20 -> 10-12
    (docs/benchmarks.md, "Prefetched into L2, not L1")."""
    fn = _declare(b, "llvm.prefetch.p0", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    b.call(fn, [at, _i32(0), _i32(1), _i32(1)])


def _heads(b, row0, row_bytes, offset, head):
    """(scales, sum factors or None) <8 x float> of the block at byte offset of eight rows from row0, rows
    row_bytes apart, for a layout with ``head``: the rows' first four bytes as one <8 x i32> (eight 32-bit
    loads; sixteen 16-bit inserts kept the shuffle port busy for most of a group's time, and AVX2's gather
    was slower still on this Xeon), their float16 halves widened. The same values, by the same operations,
    as ``emit``'s scalars."""
    at = b.gep(row0, [offset])
    words = _vector_of(b, [b.load(b.bitcast(b.gep(at, [b.mul(row_bytes, _i64(j))]), I32.as_pointer()), align=1)
                           for j in range(TILE_R)])
    v8i16, v8f16 = ir.VectorType(I16, TILE_R), ir.VectorType(F16, TILE_R)

    def widen(w):
        return b.fpext(b.bitcast(b.trunc(w, v8i16), v8f16), V8F32)

    d = widen(words)
    kind, k = head
    if kind == "dm":
        return d, widen(b.lshr(words, _const_vec(I32, [16] * TILE_R)))
    return d, (b.fmul(d, _const_vec(F32, [-k] * TILE_R)) if k is not None else None)


def _pairs_unpacked(es, pair, offset):
    """The paired values of a block of eight rows, for a layout with ``pair``: rows p and p + 4 share a vector
    (values 0-15 of p, then of p + 4; then values 16-31), four (lo, hi) pairs, unpacked once for every
    activation row (_pairs_by_row)."""
    return [pair(es[p], es[p + TILE_R // 2], offset) for p in range(TILE_R // 2)]


def _pairs_by_row(es, pairs, x):
    """<8 x i32>: lane j the integer dot product of a group of weight row j and x, from _pairs_unpacked's
    pairs: each pair times x's values 0-15 in both halves, then its values 16-31 times x's 16-31, and three
    pairwise adds gather the lanes of each row. Integer additions: exact, the same sums as _halves_by_row's."""
    b = es[0].b
    x_lo = b.shuffle_vector(x, x, _const_vec(I32, [*range(16), *range(16)]))
    x_hi = b.shuffle_vector(x, x, _const_vec(I32, [*range(16, 32), *range(16, 32)]))
    vs = [_dot_acc(es[p], es[p].dot(u_lo, x_lo), u_hi, x_hi) for p, (u_lo, u_hi) in enumerate(pairs)]
    return _hadd(b, _hadd(b, vs[0], vs[1]), _hadd(b, vs[2], vs[3]))


def _add_group(b, acc, lo, hi, scale, scale_hi, dx, sum_factor, xsum):
    """The shared chain's terms for one group (see above): lo, hi the integer sums of values 0-15 and 16-31
    (scalars or vectors, as acc), scale / scale_hi / sum_factor the weight's, dx / xsum the activations'."""
    f = acc.type
    if scale_hi is None:
        acc = _fma(b, b.sitofp(b.add(lo, hi), f), b.fmul(scale, dx), acc)
    else:
        acc = _fma(b, b.sitofp(lo, f), b.fmul(scale, dx), acc)
        acc = _fma(b, b.sitofp(hi, f), b.fmul(scale_hi, dx), acc)
    if sum_factor is not None:
        acc = _fma(b, sum_factor, xsum, acc)
    return acc


def _arrays(context, builder, sig_args, args):
    return [context.make_array(t)(context, builder, a) for t, a in zip(sig_args, args)]


def _int(context, builder, sig_arg, arg):
    return context.cast(builder, arg, sig_arg, types.int64)


def row_dot(layout: Layout):
    """An intrinsic ``(row, xq, xd, xsum, m) -> float32``: weight row ``row`` (uint8, its blocks) times
    activation row m of (xq int8 (M, K), xd float32 (M, K/32) scales, xsum float32 (M, K/32): each group's
    sum, scale included)."""

    @intrinsic
    def dot(typingctx, row, xq, xd, xsum, m):
        sig = types.float32(row, xq, xd, xsum, m)

        def codegen(context, b, signature, args):
            arow, axq, axd, axs = _arrays(context, b, signature.args[:4], args[:4])
            m0 = _int(context, b, signature.args[4], args[4])
            k = cgutils.unpack_tuple(b, axq.shape, 2)[1]
            n_groups = cgutils.unpack_tuple(b, axd.shape, 2)[1]
            e = Emitter(b, product_isa(context), arow.data)
            x_base, s_base = b.mul(m0, k), b.mul(m0, n_groups)
            acc = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))
            reduce4 = _declare(b, "llvm.vector.reduce.add.v4i32", I32, [ir.VectorType(I32, 4)])
            with cgutils.for_range(b, b.udiv(n_groups, _i64(layout.groups))) as loop:
                blk = loop.index
                for gi, g in enumerate(layout.emit(e, b.mul(blk, _i64(layout.block_bytes)))):
                    group = b.add(b.mul(blk, _i64(layout.groups)), _i64(gi))
                    v = _group_dot(e, g, e.load(axq.data, b.add(x_base, b.mul(group, _i64(QK))), V32I8))
                    lo, hi = (b.call(reduce4, [b.shuffle_vector(v, v, _const_vec(I32, range(h, h + 4)))])
                              for h in (0, 4))
                    at = b.add(s_base, group)
                    dx = b.load(b.gep(axd.data, [at]))
                    xsum_at = b.load(b.gep(axs.data, [at])) if g.sum_factor is not None else None
                    b.store(_add_group(b, b.load(acc), lo, hi, g.scale, g.scale_hi, dx, g.sum_factor, xsum_at), acc)
            return b.load(acc)

        return sig, codegen

    return dot


def rows_dot(layouts: list[Layout], n_x: int, unused: frozenset = frozenset()):
    """An intrinsic ``(fmt, w, r, xq, xd, xsum, m, out) -> int64``: weight rows r .. r + 7 of w (uint8 (N,
    bytes per row), blocks of layouts[fmt]) times activation rows m .. m + n_x - 1 (as row_dot's) into
    out[m .. m + n_x - 1, r .. r + 7] (float32 (M, N)). One intrinsic for every layout (a switch on fmt in
    the IR), so that a kernel dispatches on the weight type without a function per type. The eight weight
    rows a row a lane (_lanes_codegen) where _by_lanes says so and for weights held interleaved; the others
    keep the values in the lanes. ``unused``: the fmt the caller never passes (no code: compile time)."""

    @intrinsic
    def dot(typingctx, fmt, w, r, xq, xd, xsum, m, out):
        sig = types.int64(fmt, w, r, xq, xd, xsum, m, out)
        bodies = [_lanes_codegen(layout, n_x) if layout.interleaved or _by_lanes(layout, n_x)
                  else _rows_codegen(layout, n_x) for layout in layouts]

        def codegen(context, b, signature, args):
            which = _int(context, b, signature.args[0], args[0])
            inner = types.int64(*signature.args[1:])
            done = b.append_basic_block("rows_dot_done")
            switch = b.switch(which, done)
            for i, body in ((i, body) for i, body in enumerate(bodies) if i not in unused):
                case = b.append_basic_block(f"rows_dot_{layouts[i].name}")
                switch.add_case(_i64(i), case)
                b.position_at_end(case)
                body(context, b, inner, args[1:])
                b.branch(done)
            b.position_at_end(done)
            return ir.Constant(I64, 0)

        return sig, codegen

    return dot


@dataclass
class _Rows:
    """rows_dot's operands inside its codegen: the arrays, weight row r0 (its pointer, row0, and the bytes
    between rows), the activation rows (their first value's and first group's offsets) and a float
    accumulator of eight outputs for each."""

    aw: object
    axq: object
    axd: object
    axs: object
    aout: object
    r0: object
    row0: object
    row_bytes: object
    n_groups: object
    n_out: object
    isa: str
    ms: list
    x_base: list
    s_base: list
    acc: list


def _rows_operands(context, b, signature, args, n_x: int) -> _Rows:
    s = signature.args
    aw, axq, axd, axs, aout = _arrays(context, b, (s[0], s[2], s[3], s[4], s[6]),
                                      (args[0], args[2], args[3], args[4], args[6]))
    r0, m0 = _int(context, b, s[1], args[1]), _int(context, b, s[5], args[5])
    row_bytes = cgutils.unpack_tuple(b, aw.shape, 2)[1]
    k = cgutils.unpack_tuple(b, axq.shape, 2)[1]
    n_groups = cgutils.unpack_tuple(b, axd.shape, 2)[1]
    ms = [b.add(m0, _i64(i)) for i in range(n_x)]
    return _Rows(aw, axq, axd, axs, aout, r0, b.gep(aw.data, [b.mul(r0, row_bytes)]), row_bytes, n_groups,
                 cgutils.unpack_tuple(b, aout.shape, 2)[1], product_isa(context), ms, [b.mul(mi, k) for mi in ms],
                 [b.mul(mi, n_groups) for mi in ms],
                 [cgutils.alloca_once_value(b, ir.Constant(V8F32, None)) for _ in range(n_x)])


def _add_row_group(b, rows: _Rows, i: int, group, lo, hi, scale, scale_hi, sum_factor):
    """Activation row i's accumulator plus a group's terms (_add_group), its scale and group sum splat."""
    at = b.add(rows.s_base[i], group)
    dx = _splat(b, b.load(b.gep(rows.axd.data, [at])), TILE_R)
    xsum_at = _splat(b, b.load(b.gep(rows.axs.data, [at])), TILE_R) if sum_factor is not None else None
    b.store(_add_group(b, b.load(rows.acc[i]), lo, hi, scale, scale_hi, dx, sum_factor, xsum_at), rows.acc[i])


def _store_rows(b, rows: _Rows):
    """Each activation row's eight outputs into out[m, r0 .. r0 + 7]."""
    for i, mi in enumerate(rows.ms):
        dst = b.gep(rows.aout.data, [b.add(b.mul(mi, rows.n_out), rows.r0)])
        b.store(b.load(rows.acc[i]), b.bitcast(dst, V8F32.as_pointer()), align=4)


def _rows_codegen(layout: Layout, n_x: int):
    """The codegen of rows_dot for one layout: weight rows r .. r + 7 times activation rows m .. m + n_x - 1,
    each block unpacked in registers once and multiplied by every activation row: for a decode step or a
    few rows (speculative verification, several sequences' decode), where each weight row is read from
    memory once. The eight rows' group sums are gathered into one vector (_halves_by_row), so the float
    chain runs on eight rows at once; each activation row has its own chain, in the one-row order, so a
    row's outputs are its bits alone, whatever n_x."""

    def codegen(context, b, signature, args):
        rows = _rows_operands(context, b, signature, args, n_x)
        es = [Emitter(b, rows.isa, b.gep(rows.row0, [b.mul(rows.row_bytes, _i64(j))])) for j in range(TILE_R)]
        with cgutils.for_range(b, b.udiv(rows.n_groups, _i64(layout.groups))) as loop:
            blk = loop.index
            offset = b.mul(blk, _i64(layout.block_bytes))
            per_row = [layout.emit(e, offset) for e in es]       # (their values unused on the paired path)
            _prefetch_next(b, rows.row0, rows.row_bytes, blk, layout.block_bytes)
            pairs = _pairs_unpacked(es, layout.pair, offset) if layout.pair is not None else None
            if layout.head is not None:
                head_scale, head_sum = _heads(b, rows.row0, rows.row_bytes, offset, layout.head)
            if layout.scales8 is not None:
                scales8 = layout.scales8(b, rows.row0, rows.row_bytes, offset)
            for gi in range(layout.groups):
                group = b.add(b.mul(blk, _i64(layout.groups)), _i64(gi))
                gs = [per_row[j][gi] for j in range(TILE_R)]
                two = gs[0].scale_hi is not None
                with_sum = gs[0].sum_factor is not None
                if layout.head is not None:
                    scale, sum_factor, scale_hi = head_scale, head_sum, None
                elif layout.scales8 is not None:
                    scale, scale_hi, sum_factor = scales8[gi]
                else:
                    scale = _vector_of(b, [g.scale for g in gs])
                    sum_factor = _vector_of(b, [g.sum_factor for g in gs]) if with_sum else None
                    scale_hi = _vector_of(b, [g.scale_hi for g in gs]) if two else None
                for i in range(n_x):
                    x = es[0].load(rows.axq.data, b.add(rows.x_base[i], b.mul(group, _i64(QK))), V32I8)
                    if pairs is not None:
                        lo, hi = _pairs_by_row(es, pairs, x), ir.Constant(V8I32, None)
                    else:
                        lo, hi = _halves_by_row(b, [_group_dot(es[j], gs[j], x) for j in range(TILE_R)])
                    _add_row_group(b, rows, i, group, lo, hi, scale, scale_hi, sum_factor)
        _store_rows(b, rows)
        return ir.Constant(I64, 0)

    return codegen


# -- a few activation rows, the weight's rows in the lanes -------------------------------------------------
# From two activation rows on, _rows_codegen's gathering of eight rows' sums (_halves_by_row, _pairs_by_row:
# shuffles every group, for every activation row) costs more than turning the eight weight rows around once a
# block: their bytes as 32-bit words, transposed so that vector q holds word q (values 4q .. 4q + 3) of row 0,
# of row 1, ... of row 7, as the tiles' scratch holds them, but in registers. An activation row then takes
# each 4 of its bytes broadcast to all lanes: one product instruction a word, no shuffle, the eight rows' sums
# already a row a lane. The integers are the same (exact), and so is the float chain.
class LanesEmitter(Emitter):
    """The emitter of word q of eight weight rows (row0, rows row_bytes apart), a row a lane: bytes32,
    nibbles16 and high_bits give <32 x i8> whose lane j holds values 4q .. 4q + 3 of row j (of the 32 values
    Emitter's give), so that a layout's ``emit``, which works on each byte alike, unpacks them unchanged. Its
    scalars (row 0's) go unused: the scales come from ``head`` or ``scales8``. The eight emitters of a block
    ask for the same loads and shuffles, pure values that LLVM may compute once (not read in the assembly:
    the products' speed is measured, docs/benchmarks.md)."""

    def __init__(self, builder, isa: str, row0, row_bytes, q: int):
        super().__init__(builder, isa, row0)
        self.row_bytes, self.q = row_bytes, q

    def _at(self, j: int, offset):
        return self.b.add(self.b.mul(self.row_bytes, _i64(j)), offset)

    def words(self, offset, n: int):
        """n <8 x i32>: word w of each row's bytes from offset, a row a lane (n 8: a transposition; n 4: the
        8 x 4 one; n 1: eight loads)."""
        b = self.b
        if n == 1:
            return _words8(b, self.row, self.row_bytes, offset, 0, 1)
        if n == 4:
            v4 = ir.VectorType(I32, 4)
            rows = [b.load(self.ptr(self.row, self._at(j, offset), v4), align=1) for j in range(TILE_R)]
            return _transpose8x4(b, [b.shuffle_vector(rows[j], rows[j + 4], _const_vec(I32, range(8)))
                                     for j in range(4)])
        return _transpose8(b, [b.bitcast(self.load(self.row, self._at(j, offset), V32I8), V8I32)
                               for j in range(TILE_R)])

    def bytes32(self, offset):
        return self.b.bitcast(self.words(offset, 8)[self.q], V32I8)

    def nibbles16(self, offset):
        """Values 0-15 are the low nibbles of the 16 bytes, 16-31 the high ones: word q < 4 is the low nibbles
        of bytes 4q .. 4q + 3, word q >= 4 the high nibbles of bytes 4(q - 4) .."""
        b = self.b
        v = b.bitcast(self.words(offset, 4)[self.q % 4], V32I8)
        return b.and_(v, _const_vec(I8, [15] * 32)) if self.q < 4 else b.lshr(v, _const_vec(I8, [4] * 32))

    def high_bits(self, offset):
        """Bits 4q .. 4q + 3 of each row's uint32 at offset, times 16, in bytes 0-3 of its lane."""
        b = self.b
        word = self.words(offset, 1)[0]
        four = b.and_(b.lshr(word, _const_vec(I32, [4 * self.q] * TILE_R)), _const_vec(I32, [15] * TILE_R))
        spread = b.bitcast(b.mul(four, _const_vec(I32, [0x01010101] * TILE_R)), V32I8)
        bit = _const_vec(I8, [1, 2, 4, 8] * TILE_R)
        is_set = b.icmp_unsigned("!=", b.and_(spread, bit), ir.Constant(V32I8, None))
        return b.select(is_set, _const_vec(I8, [16] * 32), ir.Constant(V32I8, None))


# -- weights held interleaved: eight rows' blocks already a row a lane ---------------------------------------
# LanesEmitter turns eight rows around every block of every step (24 shuffles a 32 bytes of eight rows). A
# weight whose eight rows are stored turned (quantized.interleave: for each block, word w of row 0, of row 1, ..
# of row 7; llama.cpp repacks its Q4_K weights so, block_q4_Kx8) needs one load a vector. For the layouts
# whose blocks are whole words and whose scales scales8 reads (INTERLEAVED); the integers and the float chain
# stay the lanes' (the same bits). Q6_K so was slower (docs/benchmarks.md, "The 1.5B's Q4_K weights held").
INTERLEAVED = ("Q4_K", "Q5_K")


class InterleavedEmitter(LanesEmitter):
    """LanesEmitter's words from a weight held interleaved: row0 the eight rows' first byte, each word one
    load. A layout's offsets are of a row's bytes (block blk at blk x block bytes); eight times that is the
    interleaved place (row_bytes unused)."""

    def words(self, offset, n: int):
        return _words8(self.b, self.row, None, offset, 0, n)


def _transpose8(b, rows):
    """Eight <8 x i32> (a row's words) -> eight <8 x i32>, vector q holding word q of each row: pairs of
    words, then of pairs, then the 128-bit halves (24 shuffles, AVX2's unpacks and lane permutes)."""
    def two(u, v, first, second):
        return b.shuffle_vector(u, v, _const_vec(I32, first)), b.shuffle_vector(u, v, _const_vec(I32, second))
    s1 = [two(rows[2 * t], rows[2 * t + 1], [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])
          for t in range(4)]
    # s1[t] = (words 0, 1 | 4, 5 of rows 2t, 2t+1 interleaved; words 2, 3 | 6, 7)
    s2 = []
    for t in range(2):
        for h in range(2):
            s2.extend(two(s1[2 * t][h], s1[2 * t + 1][h], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]))
    # s2[4t + w] = word w | word w + 4 of rows 4t .. 4t + 3
    out = [None] * 8
    for w in range(4):
        out[w], out[w + 4] = two(s2[w], s2[4 + w], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
    return out


def _transpose8x4(b, pairs):
    """Four <8 x i32>, pairs[j] = the 4 words of row j then of row j + 4 -> four <8 x i32>, vector q holding
    word q of rows 0 .. 7 (in-lane unpacks only)."""
    def two(u, v, first, second):
        return b.shuffle_vector(u, v, _const_vec(I32, first)), b.shuffle_vector(u, v, _const_vec(I32, second))
    lo01, hi01 = two(pairs[0], pairs[1], [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])
    lo23, hi23 = two(pairs[2], pairs[3], [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])
    w0, w1 = two(lo01, lo23, [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
    w2, w3 = two(hi01, hi23, [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
    return [w0, w1, w2, w3]


# One activation row takes the lanes for Q8_0 too (Gemma 3's head 8.17 -> 5.44 ms; Q6_K's slower: docs/benchmarks.md)
ONE_ROW_LANES = frozenset(("Q8_0",))


def _by_lanes(layout: Layout, n_x: int) -> bool:
    """Whether _lanes_codegen takes the layout for n_x activation rows: its scales read for eight rows at once
    (head or scales8), and for two rows not a layout whose rows go in pairs (``pair``: its two-row vectors
    gather the sums in fewer shuffles than a transposition costs; measured, benchmarks/cpu_products.py); for
    one row only ONE_ROW_LANES."""
    return ((layout.head is not None or layout.scales8 is not None) and (n_x > 2 or layout.pair is None)
            and (n_x > 1 or layout.name in ONE_ROW_LANES))


# Signed values with VNNI: vpdpbusd multiplies unsigned bytes by signed ones, so the signed types' products
# above take |w| and x with w's sign (psign), an instruction more a word for every activation row. With the
# values biased to unsigned once a block (w + 128, one xor), a word takes only its product, and the integer
# sum less 128 x (the activations' sum) is the same sum, exact: that correction, for each 16 values of each
# activation row, is what _matmul hands the products in place of the group sums (which these types do not
# read). Not on AVX2: its pair products saturate at 16 bits, which 255 x 127 twice would pass.
def _bias_of(b, rows: _Rows, i: int, group, half: int, halves: int):
    """<8 x i32>: 128 x the sum of activation row i's values 0-15 (half 0) or 16-31 (half 1) of a group, or of
    all 32 (halves 1), from the int32 corrections _matmul passes as xsum (two a group: (M, 2 x groups))."""
    ints = b.bitcast(rows.axs.data, I32.as_pointer())
    at = b.add(b.mul(rows.s_base[i], _i64(2)), b.mul(group, _i64(2)))
    if halves == 2:
        value = b.load(b.gep(ints, [b.add(at, _i64(half))]))
    else:
        value = b.add(b.load(b.gep(ints, [at])), b.load(b.gep(ints, [b.add(at, _i64(1))])))
    return _splat(b, value, TILE_R)


def _lanes_emitters(b, isa: str, row0, row_bytes, interleaved: bool):
    """The emitters of words 0 .. 7 of eight weight rows, a row a lane."""
    kind = InterleavedEmitter if interleaved else LanesEmitter
    return [kind(b, isa, row0, row_bytes, q) for q in range(QK // 4)]


def _lanes_codegen(layout: Layout, n_x: int):
    """The codegen of rows_dot for one layout with lanes: as _rows_codegen's (the same scales, the same float
    chain a row, so the same bits), the eight weight rows unpacked a row a lane (LanesEmitter) and each group
    multiplied by every activation row's words broadcast."""

    def codegen(context, b, signature, args):
        rows = _rows_operands(context, b, signature, args, n_x)
        es = _lanes_emitters(b, rows.isa, rows.row0, rows.row_bytes, layout.interleaved)
        zero = ir.Constant(V8I32, None)
        with cgutils.for_range(b, b.udiv(rows.n_groups, _i64(layout.groups))) as loop:
            blk = loop.index
            offset = b.mul(blk, _i64(layout.block_bytes))
            words = [layout.emit(e, offset) for e in es]          # words[q][group]
            _prefetch_next(b, rows.row0, rows.row_bytes, blk, layout.block_bytes)
            if layout.head is not None:
                head_scale, head_sum = _heads(b, rows.row0, rows.row_bytes, offset, layout.head)
            else:
                scales8 = layout.scales8(b, rows.row0, None if layout.interleaved else rows.row_bytes, offset)
            for gi in range(layout.groups):
                group = b.add(b.mul(blk, _i64(layout.groups)), _i64(gi))
                g0 = words[0][gi]
                if layout.head is not None:
                    scale, sum_factor, scale_hi = head_scale, head_sum, None
                else:
                    scale, scale_hi, sum_factor = scales8[gi]
                values = [words[q][gi].values for q in range(QK // 4)]
                biased = g0.signed and rows.isa == "vnni"
                if biased:
                    unsigned = [b.xor(v, _const_vec(I8, [-128] * 32)) for v in values]
                else:
                    unsigned = [_psign(b, v, v) for v in values] if g0.signed else values
                halves = (range(4), range(4, 8)) if scale_hi is not None else (range(8),)
                for i in range(n_x):
                    at_x = b.add(rows.x_base[i], b.mul(group, _i64(QK)))
                    sums = []
                    for h, qs in enumerate(halves):
                        chains = [zero, zero]         # two running sums: half the latency of one chain
                        for q in qs:
                            word = es[0].load(rows.axq.data, b.add(at_x, _i64(4 * q)), I32)
                            xb = b.bitcast(_splat(b, word, TILE_R), V32I8)
                            chains[q % 2] = _dot_acc(es[0], chains[q % 2], unsigned[q],
                                                     _psign(b, xb, values[q]) if g0.signed and not biased else xb)
                        total = b.add(chains[0], chains[1])
                        sums.append(b.sub(total, _bias_of(b, rows, i, group, h, len(halves))) if biased else total)
                    lo, hi = sums if len(sums) == 2 else (sums[0], zero)
                    _add_row_group(b, rows, i, group, lo, hi, scale, scale_hi, sum_factor)
        _store_rows(b, rows)
        return ir.Constant(I64, 0)

    return codegen


# -- many activation rows: a tile of weight rows unpacked once, their rows in a vector's lanes -----------
# A prefill chunk multiplies every weight row by many activation rows. row_dot would unpack a row's blocks
# again for every activation row (Q5_0's fifth bits cost more than the products), so a batch first unpacks
# TILE_R weight rows into scratch (``unpack_row``), interleaved as llama.cpp's repacked Q4_0 x8 blocks are:
# for each group and each 4 values of it, the 4 bytes of row 0, of row 1, ... of row 7 (32 bytes, one
# vector). ``tile_dot`` then multiplies one such vector by 4 activation bytes broadcast to all lanes: one
# instruction adds 4 products to each of 8 rows' integer sums, and the float chain (scale, fused
# multiply-add) runs once a group for 8 rows at a time, not once a group for each row.
TILE_BYTES = TILE_R * QK            # a group's scratch bytes


def _scratch_operands(context, b, signature, args):
    """An unpacking intrinsic's operands: its weight, its index (slot or row), the scratch, the groups of K."""
    s = signature.args
    first, awq, awa, aws, awsf = _arrays(context, b, (s[0], *s[2:]), (args[0], *args[2:]))
    n_groups = b.udiv(cgutils.unpack_tuple(b, aws.shape, 1)[0], _i64(16))
    return first, _int(context, b, s[1], args[1]), awq, awa, aws, awsf, n_groups


def unpack_row(layout: Layout):
    """An intrinsic ``(row, slot, wq, wa, ws, wsf) -> int64``: weight row ``row`` (uint8, its blocks) into
    lane ``slot`` of a tile's scratch: wq int8 (K / 32 * TILE_BYTES) its values (for signed types their
    magnitudes), wa int8 (likewise) the signed values (signed types), ws float32 (K / 32 * 16) each group's
    scale at group * 16 + slot and its second scale (or the first again) at group * 16 + 8 + slot, wsf
    float32 (K / 32 * 8) each group's sum factor at group * 8 + slot."""
    signed = layout.name in SIGNED

    @intrinsic
    def unpack(typingctx, row, slot, wq, wa, ws, wsf):
        sig = types.int64(row, slot, wq, wa, ws, wsf)

        def codegen(context, b, signature, args):
            arow, j, awq, awa, aws, awsf, n_groups = _scratch_operands(context, b, signature, args)
            e = Emitter(b, isa_of(context) or "avx2", arow.data)
            lane = b.mul(j, _i64(4))

            def scatter(base, values, group):
                words = b.bitcast(values, V8I32)
                for q in range(QK // 4):
                    at = b.add(b.add(b.mul(group, _i64(TILE_BYTES)), _i64(q * TILE_R * 4)), lane)
                    b.store(b.extract_element(words, _i32(q)), e.ptr(base, at, I32), align=1)

            with cgutils.for_range(b, b.udiv(n_groups, _i64(layout.groups))) as loop:
                blk = loop.index
                for gi, g in enumerate(layout.emit(e, b.mul(blk, _i64(layout.block_bytes)))):
                    group = b.add(b.mul(blk, _i64(layout.groups)), _i64(gi))
                    scatter(awq.data, _psign(b, g.values, g.values) if signed else g.values, group)
                    if signed:
                        scatter(awa.data, g.values, group)
                    at = b.add(b.mul(group, _i64(16)), j)
                    b.store(g.scale, b.gep(aws.data, [at]))
                    b.store(g.scale_hi if g.scale_hi is not None else g.scale, b.gep(aws.data, [b.add(at, _i64(8))]))
                    if g.sum_factor is not None:
                        b.store(g.sum_factor, b.gep(awsf.data, [b.add(b.mul(group, _i64(8)), j)]))
            return ir.Constant(I64, 0)

        return sig, codegen

    return unpack


def unpack_tile(layout: Layout):
    """An intrinsic ``(w, r0, wq, wa, ws, wsf) -> int64``: weight rows r0 .. r0 + 7 of w held interleaved into
    a tile's scratch, as unpack_row puts eight rows there: each group's words already a row a lane (one store
    a vector), its scales from scales8 (the values emit computes, by the same operations)."""

    @intrinsic
    def unpack(typingctx, w, r0, wq, wa, ws, wsf):
        sig = types.int64(w, r0, wq, wa, ws, wsf)

        def codegen(context, b, signature, args):
            aw, r0, awq, awa, aws, awsf, n_groups = _scratch_operands(context, b, signature, args)
            row0 = b.gep(aw.data, [b.mul(r0, cgutils.unpack_tuple(b, aw.shape, 2)[1])])
            es = _lanes_emitters(b, isa_of(context) or "avx2", row0, None, True)
            with cgutils.for_range(b, b.udiv(n_groups, _i64(layout.groups))) as loop:
                offset = b.mul(loop.index, _i64(layout.block_bytes))
                words = [layout.emit(e, offset) for e in es]          # words[q][group]
                scales8 = layout.scales8(b, row0, None, offset)
                for gi in range(layout.groups):
                    group = b.add(b.mul(loop.index, _i64(layout.groups)), _i64(gi))
                    for q in range(QK // 4):
                        v = words[q][gi].values
                        at = b.add(b.mul(group, _i64(TILE_BYTES)), _i64(q * TILE_R * 4))
                        b.store(_psign(b, v, v) if words[q][gi].signed else v, es[0].ptr(awq.data, at, V32I8),
                                align=1)
                        if words[q][gi].signed:
                            b.store(v, es[0].ptr(awa.data, at, V32I8), align=1)
                    scale, scale_hi, sum_factor = scales8[gi]
                    at = b.mul(group, _i64(16))
                    b.store(scale, es[0].ptr(aws.data, at, V8F32), align=4)
                    b.store(scale_hi if scale_hi is not None else scale,
                            es[0].ptr(aws.data, b.add(at, _i64(8)), V8F32), align=4)
                    if sum_factor is not None:
                        b.store(sum_factor, es[0].ptr(awsf.data, b.mul(group, _i64(8)), V8F32), align=4)
            return ir.Constant(I64, 0)

        return sig, codegen

    return unpack


def tile_dot(kind: int, n_x: int):
    """An intrinsic ``(wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid) -> int64``: a tile's scratch
    (unpack_row; its first n_valid lanes hold weight rows r0 ..) times activation rows m .. m + n_x - 1,
    into out[m + i, r0 + j] for j < n_valid. kind: an index into KINDS."""
    signed, with_sum, two = KINDS[kind]

    @intrinsic
    def dot(typingctx, wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid):
        sig = types.int64(wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)

        def codegen(context, b, signature, args):
            s = signature.args
            awq, awa, aws, awsf, axq, axd, axs, aout = _arrays(context, b, s[:7] + (s[8],), args[:7] + (args[8],))
            m0, c0, nv = (_int(context, b, s[i], args[i]) for i in (7, 9, 10))
            k = cgutils.unpack_tuple(b, axq.shape, 2)[1]
            n_groups = cgutils.unpack_tuple(b, axd.shape, 2)[1]
            n_out = cgutils.unpack_tuple(b, aout.shape, 2)[1]
            e = Emitter(b, product_isa(context), None)
            x_base = [b.mul(b.add(m0, _i64(i)), k) for i in range(n_x)]
            d_base = [b.mul(b.add(m0, _i64(i)), n_groups) for i in range(n_x)]
            acc = [cgutils.alloca_once_value(b, ir.Constant(V8F32, None)) for _ in range(n_x)]
            zero = ir.Constant(V8I32, None)
            with cgutils.for_range(b, n_groups) as loop:
                group = loop.index
                wbase, xoff = b.mul(group, _i64(TILE_BYTES)), b.mul(group, _i64(QK))
                scales = [b.load(e.ptr(aws.data, b.add(b.mul(group, _i64(16)), _i64(h)), V8F32), align=4)
                          for h in (0, 8)]
                dx = [_splat(b, b.load(b.gep(axd.data, [b.add(d_base[i], group)])), TILE_R) for i in range(n_x)]
                halves = []
                for qs in ((range(4), range(4, 8)) if two else (range(8),)):
                    sums = [zero] * n_x
                    for q in qs:
                        at = b.add(wbase, _i64(q * TILE_R * 4))
                        wv = e.load(awq.data, at, V32I8)
                        sv = e.load(awa.data, at, V32I8) if signed else None
                        for i in range(n_x):
                            word = e.load(axq.data, b.add(b.add(x_base[i], xoff), _i64(4 * q)), I32)
                            xb = b.bitcast(_splat(b, word, TILE_R), V32I8)
                            sums[i] = _dot_acc(e, sums[i], wv, _psign(b, xb, sv) if signed else xb)
                    halves.append(sums)
                if not two:
                    halves.append([zero] * n_x)
                wsf = b.load(e.ptr(awsf.data, b.mul(group, _i64(8)), V8F32), align=4) if with_sum else None
                for i in range(n_x):
                    xsum_at = (_splat(b, b.load(b.gep(axs.data, [b.add(d_base[i], group)])), TILE_R)
                               if with_sum else None)
                    b.store(_add_group(b, b.load(acc[i]), halves[0][i], halves[1][i], scales[0],
                                       scales[1] if two else None, dx[i], wsf, xsum_at), acc[i])
            full = b.icmp_signed("==", nv, _i64(TILE_R))
            for i in range(n_x):
                row = b.gep(aout.data, [b.add(b.mul(b.add(m0, _i64(i)), n_out), c0)])
                v = b.load(acc[i])
                with b.if_else(full) as (whole, part):
                    with whole:
                        b.store(v, b.bitcast(row, V8F32.as_pointer()), align=4)
                    with part:
                        for j in range(TILE_R):
                            with b.if_then(b.icmp_signed("<", _i64(j), nv)):
                                b.store(b.extract_element(v, _i32(j)), b.gep(row, [_i64(j)]))
            return ir.Constant(I64, 0)

        return sig, codegen

    return dot


# -- attention's scores ---------------------------------------------------------------------------------
def _lanes8_sums(b, aq, ak, q_ats, k_at, n):
    """Each q row's (flat offsets q_ats) dot product with k's row at k_at, lanes8_dot's order; the rows' chains of adds
    side by side, k's row loaded once for them all."""
    accs = [cgutils.alloca_once_value(b, ir.Constant(V8F32, None)) for _ in q_ats]
    with cgutils.for_range(b, b.udiv(n, _i64(8))) as loop:
        j = b.mul(loop.index, _i64(8))
        kv = b.load(b.bitcast(b.gep(ak.data, [b.add(k_at, j)]), V8F32.as_pointer()), align=4)
        for q_at, acc in zip(q_ats, accs):
            qv = b.load(b.bitcast(b.gep(aq.data, [b.add(q_at, j)]), V8F32.as_pointer()), align=4)
            b.store(b.fadd(b.load(acc), b.fmul(qv, kv)), acc)
    sums = []
    for acc in accs:
        v = b.load(acc)
        p = [b.extract_element(v, _i32(i)) for i in range(8)]
        sums.append(b.fadd(b.fadd(b.fadd(p[0], p[1]), b.fadd(p[2], p[3])),
                           b.fadd(b.fadd(p[4], p[5]), b.fadd(p[6], p[7]))))
    return sums


def _lanes8_codegen(context, b, signature, args):
    aq, ak = _arrays(context, b, (signature.args[0], signature.args[2]), (args[0], args[2]))
    q_at, k_at, n = (_int(context, b, signature.args[i], args[i]) for i in (1, 3, 4))
    return _lanes8_sums(b, aq, ak, [q_at], k_at, n)[0]


@intrinsic
def lanes8_dot(typingctx, q, q_at, k, k_at, n):
    """float32: the n (a multiple of 8) products of q's and k's float32 values from flat offsets q_at and k_at,
    element j into running sum j mod 8 (a multiply, then an add: no fused multiply-add), then
    ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)): attention.py's order for a key's score, in one vector."""
    return types.float32(q, q_at, k, k_at, n), _lanes8_codegen


def _lanes8_dot4_codegen(context, b, signature, args):
    aq, ak = _arrays(context, b, (signature.args[0], signature.args[3]), (args[0], args[3]))
    q_at, q_step, k_at, n = (_int(context, b, signature.args[i], args[i]) for i in (1, 2, 4, 5))
    q_ats = [b.add(q_at, b.mul(q_step, _i64(r))) for r in range(4)]
    return context.make_tuple(b, signature.return_type, _lanes8_sums(b, aq, ak, q_ats, k_at, n))


@intrinsic
def lanes8_dot4(typingctx, q, q_at, q_step, k, k_at, n):
    """lanes8_dot of four rows of q (flat offsets q_at + r * q_step, r < 4) with one row of k, as a 4-tuple:
    each the same bits as lanes8_dot of that row, k's row read once for the four. One row's sums are a chain of
    dependent adds (n / 8 of them); four chains side by side keep the adder busy."""
    return types.UniTuple(types.float32, 4)(q, q_at, q_step, k, k_at, n), _lanes8_dot4_codegen


# -- a hint to the memory system --------------------------------------------------------------------------
def _prefetch_codegen(context, b, signature, args):
    (arr,) = _arrays(context, b, (signature.args[0],), (args[0],))
    at, n = (_int(context, b, signature.args[i], args[i]) for i in (1, 2))
    base = b.bitcast(b.gep(arr.data, [at]), I8.as_pointer())
    with cgutils.for_range(b, b.udiv(b.add(n, _i64(15)), _i64(16))) as loop:       # 16 floats a 64-byte line
        _prefetch(b, b.gep(base, [b.mul(loop.index, _i64(64))]))
    return context.get_dummy_value()


@intrinsic
def prefetch_floats(typingctx, a, at, n):
    """Ask for the cache lines of n float32 values of a from flat offset at (_prefetch): a hint, which changes no
    result."""
    return types.void(a, at, n), _prefetch_codegen
