"""Which nodes of a fragment become one fused kernel, for decode (one row of x): the decision, made by
matching runs of nodes, that every plugin with fused decode kernels takes from here (the Vulkan plugin's
WGSL, the OpenCL plugin's OpenCL C), so the two cannot drift apart. A plugin hands ``plan`` a target that
answers the device questions (which weight types its fused products read, how many chunks a weight is
split into, whether a group's kernel fits the device's limits, which head sizes its attention takes).

The fusions, each turned off by name (the plugins' ``*_UNFUSE`` settings, read by ``parse_off``):

* ``attn``: the attention block: Q, K and V products of one x, their per-head norms, rope, the scale of
  q, the two cache writes and the attention itself, one kernel (AttnGroup);
* ``combine``: the split attention's combine pass into the prologue of the product that reads its
  result (the attention's output projection);
* ``norm``: RMS_NORM and its MUL by a gain into the prologue of the products that read it, with what
  comes before it in the row: a residual ADD, a post-norm before that add, a SCALE, a one-row GET_ROWS;
* ``add``: a residual ADD into the epilogue of the product it adds to;
* ``glu``: two products of one x (gate and up) as one kernel, GLU in its epilogue;
* ``rms_mul``: RMS_NORM followed by its MUL by a gain as one kernel where nothing else takes it
  (prefill too; the plugin's own lowering applies it).

A group is only formed where every node it absorbs is read inside the group alone (or is written by the
kernel, and read only after it), so the fused program computes what the graph says; anything else is
lowered node by node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .ops import VIEW_OPS
from .tensor import LeafKind, Tensor

FUSIONS = ("attn", "combine", "norm", "add", "glu", "rms_mul")
# a head's q rows times x's length from which an attention block's Q, K and V are a matrix-vector kernel of
# their own before the attention kernel (over the three weights, the norm in its prologue) in both GPU
# plugins (the tests set it to 0 to take that path on small models). Inside the attention kernel every
# workgroup of a head projects that head's rows again: on the H200 Gemma 3's 256 x 640 took 53 us a layer
# that way through Vulkan; SmolLM2's 64 x 576 is faster inside than as 30 more kernels.
ATTN_OWN_PRODUCTS = 1 << 17
GROUP_FUSIONS = frozenset({"attn", "combine", "norm", "add", "glu"})    # those plan() forms groups for


def parse_off(value: str, variable: str) -> frozenset[str]:
    """The fusions a setting's value (comma-separated names, or "all") turns off; an unknown name is a
    ValueError that names the variable and lists them."""
    names = {v.strip().lower() for v in (value or "").split(",") if v.strip()}
    if "all" in names:
        return frozenset(FUSIONS)
    unknown = sorted(names - set(FUSIONS))
    if unknown:
        raise ValueError(f"{variable}={value!r}: no fusion named {', '.join(map(repr, unknown))}; the fusions "
                         f"are {', '.join(FUSIONS)}, or 'all'")
    return frozenset(names)


@dataclass(frozen=True)
class Prologue:
    """How a fused kernel makes its x: ``plain``, x = A; ``norm``, x = rms_norm(y) * Gn, where y = A,
    A + B (``add``), rms_norm(A) * Gp + B (``prenorm``: a post-norm and the residual add before it) or
    A * scale (``scale``), y written to Y where other nodes read it (write_y); ``combine``, x = the
    split attention's partials combined."""
    src: str                 # "plain" | "norm" | "combine"
    pre: str = ""            # norm's y: "" (A) | "add" | "prenorm" | "scale"
    write_y: bool = False

    def roles(self) -> list[str]:
        """The tensors it reads (and Y, which it writes), in the kernels' order."""
        if self.src == "combine":
            return ["P"]
        if self.src == "plain":
            return ["A"]
        return ["A"] + (["B"] if self.pre in ("add", "prenorm") else []) + (["Gp"] if self.pre == "prenorm" else []) \
            + ["Gn"] + (["Y"] if self.write_y else [])


class Target(Protocol):
    """What plan() asks of the plugin that lowers the groups."""
    weight_types: frozenset[str]            # the weight types its fused products read

    def chunks(self, w: Tensor) -> int: ...          # buffers a weight is split into (1: whole)
    def product_fits(self, g: "ProductGroup") -> bool: ...
    def attn_fits(self, g: "AttnGroup") -> bool: ...
    def head_ok(self, d: int) -> bool: ...           # an attention block takes heads of d values
    # (optional) attn_biases = True: its attention blocks add a bias to Q, K and V (without it, a block
    # whose products have biases is not formed)


@dataclass(eq=False)
class Sources:
    """What a prologue reads: its kind (Prologue) and the tensors behind its roles."""
    prologue: Prologue
    a: Tensor | None = None
    b: Tensor | None = None
    g: Tensor | None = None
    g1: Tensor | None = None         # the post-norm's gain before the residual add ("prenorm")
    eps: float = 0.0
    eps1: float = 0.0
    scale: float = 1.0
    y: Tensor | None = None          # the node whose value the prologue writes
    fa: Tensor | None = None         # combine: the attention whose partials it reads


@dataclass(eq=False)
class ProductGroup:
    """A product kernel: products (one, or gate and up) of one x, with a prologue and an epilogue."""
    muls: list[Tensor]
    src: Sources
    epilogue: str                    # "" | "add" | "glu"
    out: Tensor                      # the node whose value the kernel writes
    residual: Tensor | None = None
    nodes: list[Tensor] = field(default_factory=list)    # every node absorbed


@dataclass(eq=False)
class AttnGroup:
    """An attention block: the attention of one query row and everything that makes its q, k and v."""
    fa: Tensor
    src: Sources
    wq: Tensor
    wk: Tensor
    wv: Tensor
    rope: Tensor                     # q's ROPE (k's has the same positions and parameters)
    q_norm: tuple | None             # (gain, eps) of q's per-head norm
    k_norm: tuple | None
    q_scale: float
    k_set: Tensor                    # the two SET_ROWS
    v_set: Tensor
    combined: bool = True            # False: the partials are read by a product's prologue instead
    nodes: list[Tensor] = field(default_factory=list)
    biases: tuple = (None, None, None)   # the bias added to Q's, K's, V's product (Qwen2's), or None each


def wants_own_products(g: AttnGroup) -> bool:
    """Whether an attention block's heads are large enough for Q, K and V to be a kernel of their own
    (ATTN_OWN_PRODUCTS); the plugin then checks that its kernel fits."""
    return g.fa.src[0].shape[2] * g.wq.shape[1] >= ATTN_OWN_PRODUCTS


@dataclass
class FusionPlan:
    groups: list                                       # ProductGroup | AttnGroup, in node order
    anchor: dict[int, object] = field(default_factory=dict)    # id(node) -> group emitted there
    absorbed: set[int] = field(default_factory=set)    # nodes the groups take (not lowered alone)
    combine_into: dict[int, ProductGroup] = field(default_factory=dict)   # id(fa) -> the product reading it


class Matcher:
    def __init__(self, target, fragment, off: frozenset[str], excluded: frozenset[int] = frozenset()):
        self.target, self.off, self.excluded = target, off, excluded
        self.nodes = fragment.nodes
        self.pos = {id(n): i for i, n in enumerate(self.nodes)}
        self.readers: dict[int, list[Tensor]] = {}
        for n in self.nodes:
            for s in n.src:
                self.readers.setdefault(id(s), []).append(n)
        self.outputs = {id(t) for t in fragment.outputs}
        self.claimed: dict[int, object] = {}          # id(node) -> its group
        self.made: set[int] = set()                   # nodes a group writes (readable by later kernels)
        self.attn_fa: set[int] = set()                # attention nodes of attention blocks

    # -- small questions --------------------------------------------------------------------
    def only_read_by(self, t: Tensor, allowed) -> bool:
        """t is a node of this fragment, not claimed, not an output, read by nodes of `allowed` alone."""
        if t.is_leaf or id(t) not in self.pos or id(t) in self.claimed or id(t) in self.outputs:
            return False
        ids = {id(a) for a in allowed}
        return all(id(r) in ids for r in self.readers.get(id(t), []))

    def available(self, t: Tensor) -> bool:
        """A value a kernel can bind: a leaf or argument, a node lowered alone, or one a group writes."""
        return id(t) not in self.claimed or id(t) in self.made

    def offset(self, t: Tensor) -> int:
        """t's element offset in the value it views (0 for arguments: their runtime offsets are aligned
        by the program where a kernel reads them as vec4)."""
        off = 0
        while t.op in VIEW_OPS and id(t) in self.pos:
            off += int(t.params.get("offset", 0)) if t.op == "VIEW" else 0
            t = t.src[0]
        return off

    def vec4_ok(self, t: Tensor) -> bool:
        """t can be read as vec4: F32, contiguous, a multiple of 4 elements at an offset of one."""
        return t.dtype.name == "F32" and t.contiguous and t.nelements % 4 == 0 and self.offset(t) % 4 == 0

    def gain_ok(self, g: Tensor, n: int, vec4: bool = True) -> bool:
        """g can be a norm's gain over rows of n: one row of n F32 values, in one binding."""
        if g.dtype.name != "F32" or not g.contiguous or g.nelements != n or any(d != 1 for d in g.shape[:-1]):
            return False
        if vec4 and not self.vec4_ok(g):
            return False
        weight = g.is_leaf and g.kind == LeafKind.WEIGHT
        return self.available(g) and not (weight and self.target.chunks(g) > 1)

    def weight_ok(self, w: Tensor) -> bool:
        return (w.is_leaf and w.kind == LeafKind.WEIGHT and w.dtype.name in self.target.weight_types
                and len(w.shape) == 2 and w.shape[1] % 32 == 0)

    @staticmethod
    def rows_of(t: Tensor) -> int:
        return t.nelements // t.shape[-1] if t.shape else 1

    def claim(self, group, nodes, made=()) -> None:
        nodes = list({id(n): n for n in nodes}.values())
        for n in nodes:
            self.claimed[id(n)] = group
        self.made.update(id(n) for n in made)
        group.nodes = nodes

    # -- prologues --------------------------------------------------------------------------
    def sources(self, x: Tensor, consumers: list[Tensor]) -> tuple[Sources | None, list[Tensor]]:
        """How a kernel whose products read x makes it, and the nodes that absorbs."""
        k = x.shape[-1]
        norm = x.src[0] if x.op == "MUL" and x.src and x.src[0].op == "RMS_NORM" else None
        if ("norm" not in self.off and norm is not None and self.only_read_by(x, consumers)
                and self.only_read_by(norm, [x]) and self.gain_ok(x.src[1], k) and tuple(norm.shape) == tuple(x.shape)):
            src, nodes = self._before_norm(norm.src[0], norm)
            if src is not None:
                src.g, src.eps = x.src[1], float(norm.params["eps"])
                return src, nodes + [norm, x]
        fa = x.src[0] if x.op == "RESHAPE" else None
        if (fa is not None and fa.op == "FLASH_ATTN_EXT" and id(fa) in self.attn_fa and "combine" not in self.off
                and self.only_read_by(x, consumers) and [id(r) for r in self.readers.get(id(fa), [])] == [id(x)]
                and id(fa) not in self.outputs):
            return Sources(Prologue("combine"), fa=fa), [x]
        if not self.available(x) or not self.vec4_ok(x):
            return None, []
        return Sources(Prologue("plain"), a=x), []

    def _before_norm(self, y: Tensor, norm: Tensor) -> tuple[Sources | None, list[Tensor]]:
        """The row the norm reads: a value made elsewhere (A), or made here from A and B."""
        nodes, reader = [], norm
        if (y.op == "GET_ROWS" and not y.src[0].is_leaf and self.rows_of(y.src[0]) == 1 and y.src[1].nelements == 1
                and self.only_read_by(y, [norm])):
            nodes.append(y)           # one row of a one-row value: that row (any valid index is 0)
            reader, y = y, y.src[0]
        plain = (Sources(Prologue("norm"), a=y) if self.available(y) and self.vec4_ok(y) else None), nodes
        if y.is_leaf or id(y) in self.claimed or id(y) not in self.pos or not self.vec4_ok(y):
            return plain
        write = any(r is not reader for r in self.readers.get(id(y), [])) or id(y) in self.outputs
        if y.op == "ADD" and tuple(y.src[0].shape) == tuple(y.src[1].shape) == tuple(y.shape):
            for nrm, res in (y.src, y.src[::-1]):
                pre = nrm.src[0] if nrm.op == "MUL" and nrm.src[0].op == "RMS_NORM" else None
                if (pre is not None and self.only_read_by(nrm, [y]) and self.only_read_by(pre, [nrm])
                        and self.gain_ok(nrm.src[1], y.shape[-1]) and self.available(pre.src[0])
                        and self.vec4_ok(pre.src[0]) and self.available(res) and self.vec4_ok(res)):
                    return Sources(Prologue("norm", "prenorm", write), a=pre.src[0], b=res, g1=nrm.src[1],
                                   eps1=float(pre.params["eps"]), y=y if write else None), nodes + [pre, nrm, y]
            a, b = y.src
            if all(self.available(t) and self.vec4_ok(t) for t in (a, b)):
                return Sources(Prologue("norm", "add", write), a=a, b=b, y=y if write else None), nodes + [y]
        if y.op == "SCALE" and self.available(y.src[0]) and self.vec4_ok(y.src[0]):
            return (Sources(Prologue("norm", "scale", write), a=y.src[0], scale=float(y.params["scale"]),
                            y=y if write else None), nodes + [y])
        return plain

    # -- products ----------------------------------------------------------------------------
    def product(self, n: Tensor) -> ProductGroup | None:
        w, x = n.src
        if not self.weight_ok(w) or self.rows_of(x) != 1 or x.shape[-1] != w.shape[1]:
            return None
        readers = self.readers.get(id(n), [])
        muls, epilogue, out, residual = [n], "", n, None
        if "glu" not in self.off and len(readers) == 1 and readers[0].op == "GLU":
            glu = readers[0]
            gate, up = glu.src
            other = up if gate is n else gate
            if (other.op == "MUL_MAT" and other is not n and other.src[1] is x and self.weight_ok(other.src[0])
                    and tuple(other.src[0].shape) == tuple(w.shape) and self.only_read_by(other, [glu])
                    and self.only_read_by(n, [glu]) and id(glu) not in self.claimed
                    and self.target.chunks(w) == 1 and self.target.chunks(other.src[0]) == 1):
                muls, epilogue, out = [gate, up], "glu", glu
        if not epilogue and "add" not in self.off and len(readers) == 1 and readers[0].op == "ADD":
            add = readers[0]
            r = add.src[1] if add.src[0] is n else add.src[0]
            if (r is not n and tuple(r.shape) == tuple(n.shape) == tuple(add.shape) and self.only_read_by(n, [add])
                    and id(add) not in self.claimed and self.available(r) and r.dtype.name == "F32" and r.contiguous):
                epilogue, out, residual = "add", add, r
        src, pro_nodes = self.sources(x, muls)
        if src is None or (src.prologue.src == "plain" and not epilogue):
            return None
        group = ProductGroup(muls, src, epilogue, out, residual)
        if not self.target.product_fits(group):
            return None
        self.claim(group, pro_nodes + muls + [out], made=[out] + ([src.y] if src.y is not None else []))
        return group

    # -- attention ---------------------------------------------------------------------------
    def attention_core(self, fa: Tensor) -> dict | None:
        """The nodes that make an attention's q, k and v from one x (the prologue left to attention())."""
        if len(fa.src) < 3 or fa.src[0].shape[0] != 1:
            return None
        q, k_all, v_all = fa.src[:3]
        _, h, d = q.shape
        _, hkv, _ = k_all.shape
        if d % 4 or not self.target.head_ok(d) or h % hkv or any(not self.vec4_ok(t) for t in (q, k_all, v_all)):
            return None
        nodes: list[Tensor] = []
        q_scale = 1.0
        if q.op == "SCALE" and self.only_read_by(q, [fa]):
            nodes.append(q)
            q_scale, q = float(q.params["scale"]), q.src[0]
        rope = q
        if (rope.op != "ROPE" or len(rope.src) != 2 or not self.only_read_by(rope, [nodes[-1] if nodes else fa])
                or not rope.src[1].is_leaf):
            return None                  # (frequency factors, a third operand, are not in the table on the host)
        n_dims = int(rope.params["n_dims"])
        if n_dims % 2 or n_dims > d:
            return None
        q_norm, mq, q_nodes = self._head(rope.src[0], rope, (1, h, d))
        mq, bq = mq if mq is not None else (None, None)
        k_set, k_rows = self._cache_write(k_all, fa)
        v_set, v_rows = self._cache_write(v_all, fa)
        if mq is None or k_set is None or v_set is None or k_set.src[2] is not v_set.src[2]:
            return None
        k_rope = k_rows.src[0]
        if (k_rope.op != "ROPE" or len(k_rope.src) != 2 or k_rope.src[1] is not rope.src[1]
                or k_rope.params != rope.params or not self.only_read_by(k_rope, [k_rows])):
            return None
        k_norm, mk, k_nodes = self._head(k_rope.src[0], k_rope, (1, hkv, d))
        mk, bk = mk if mk is not None else (None, None)
        v_nodes, v, reader = [], v_rows, v_set
        while v.op == "RESHAPE" and self.only_read_by(v, [reader]):
            v_nodes.append(v)
            reader, v = v, v.src[0]
        v, bv, v_add = self._biased(v, reader)
        if v_add is not None:
            v_nodes.append(v_add)
            reader = v_add
        if mk is None or v.op != "MUL_MAT" or not self.only_read_by(v, [reader]) or self.rows_of(v) != 1:
            return None
        biases = (bq, bk, bv)
        if any(b is not None for b in biases) and not getattr(self.target, "attn_biases", False):
            return None
        muls = [mq, mk, v]
        x = mq.src[1]
        if any(m.src[1] is not x for m in muls) or not all(self.weight_ok(m.src[0]) for m in muls):
            return None
        if (mq.src[0].shape[0] != h * d or mk.src[0].shape[0] != hkv * d or v.src[0].shape[0] != hkv * d
                or any(self.target.chunks(m.src[0]) > 1 for m in muls)):
            return None
        for gain in (q_norm, k_norm):
            if gain is not None and not self.gain_ok(gain[0], d, vec4=False):
                return None
        mask = fa.src[3] if len(fa.src) > 3 else None
        if mask is not None and not (mask.dtype.name == "F32" and mask.contiguous and self.available(mask)):
            return None
        inner = nodes + [rope] + q_nodes + [k_all, k_set, k_rows, k_rope] + k_nodes + [v_all, v_set] + v_nodes + [v]
        return {"x": x, "muls": muls, "rope": rope, "q_norm": q_norm, "k_norm": k_norm, "q_scale": q_scale,
                "k_set": k_set, "v_set": v_set, "nodes": inner, "biases": biases}

    def attention(self, fa: Tensor, core: dict) -> AttnGroup | None:
        if any(id(n) in self.claimed for n in core["nodes"] + [fa]):
            return None
        src, pro_nodes = self.sources(core["x"], core["muls"])
        if src is None or src.prologue.src == "combine":
            return None
        wq, wk, wv = (m.src[0] for m in core["muls"])
        group = AttnGroup(fa, src, wq, wk, wv, core["rope"], core["q_norm"], core["k_norm"], core["q_scale"],
                          core["k_set"], core["v_set"], biases=core["biases"])
        if not self.target.attn_fits(group):
            return None
        self.claim(group, pro_nodes + core["nodes"] + [fa],
                   made=[core["k_set"], core["v_set"], fa] + ([src.y] if src.y is not None else []))
        self.attn_fa.add(id(fa))
        return group

    def _head(self, t: Tensor, reader: Tensor, shape) -> tuple:
        """(per-head norm (gain, eps) or None, (the MUL_MAT, its bias or None), the nodes) of
        RESHAPE(MUL_MAT [+ bias]) [-> norm]."""
        nodes, norm = [], None
        if t.op == "MUL" and t.src[0].op == "RMS_NORM" and self.only_read_by(t, [reader]):
            rms = t.src[0]
            if not self.only_read_by(rms, [t]) or tuple(rms.shape) != tuple(shape):
                return None, None, []
            norm = (t.src[1], float(rms.params["eps"]))
            nodes += [t, rms]
            reader, t = rms, rms.src[0]
        if t.op != "RESHAPE" or tuple(t.shape) != tuple(shape) or not self.only_read_by(t, [reader]):
            return None, None, []
        mm, bias, added = self._biased(t.src[0], t)
        if mm.op != "MUL_MAT" or not self.only_read_by(mm, [added if added is not None else t]) \
                or self.rows_of(mm) != 1:
            return None, None, []
        return norm, (mm, bias), nodes + [t, mm] + ([added] if added is not None else [])

    def _biased(self, t: Tensor, reader: Tensor) -> tuple:
        """(the product, its bias, the ADD) where t is ADD(MUL_MAT, bias) read by reader alone (a bias: one
        F32 weight row of the product's width), else (t, None, None)."""
        if t.op != "ADD" or not self.only_read_by(t, [reader]):
            return t, None, None
        mm, bias = t.src
        if (mm.op != "MUL_MAT" or not (bias.is_leaf and bias.kind == LeafKind.WEIGHT) or bias.dtype.name != "F32"
                or bias.nelements != mm.shape[-1] or tuple(t.shape) != tuple(mm.shape)):
            return t, None, None
        return mm, bias, t

    def _cache_write(self, view: Tensor, fa: Tensor) -> tuple:
        """(SET_ROWS, the RESHAPE it writes) under the cache view an attention reads."""
        if view.op != "VIEW" or int(view.params.get("offset", 0)) != 0 or not self.only_read_by(view, [fa]):
            return None, None
        st = view.src[0]
        if st.op != "SET_ROWS" or id(st) in self.claimed or [id(r) for r in self.readers.get(id(st), [])] != [id(view)]:
            return None, None
        cache, rows, idx = st.src
        home = cache.storage              # the cache leaf, or earlier SET_ROWS into it (read in place)
        if not (home.is_leaf and home.kind == LeafKind.CACHE and home.dtype.name == "F32") or idx.nelements != 1:
            return None, None
        if not cache.is_leaf and (cache.op != "SET_ROWS" or not self.available(cache)):
            return None, None
        if tuple(cache.shape[1:]) != (view.shape[1] * view.shape[2],) or view.shape[0] > cache.shape[0]:
            return None, None
        if rows.op != "RESHAPE" or not self.only_read_by(rows, [st]):
            return None, None
        return st, rows

    # -- the plan ----------------------------------------------------------------------------
    def plan(self) -> FusionPlan:
        cores = {}
        if "attn" not in self.off:
            for n in self.nodes:
                if n.op == "FLASH_ATTN_EXT" and id(n) not in self.excluded:
                    core = self.attention_core(n)
                    if core is not None:
                        cores[id(core["muls"][0])] = (n, core)
        groups = []
        for n in self.nodes:          # in node order: a product takes its epilogue before a later prologue can
            if n.op != "MUL_MAT" or id(n) in self.claimed or id(n) in self.excluded:
                continue
            if id(n) in cores:
                g = self.attention(*cores[id(n)])
            else:
                g = self.product(n)
            if g is not None:
                groups.append(g)
        fp = FusionPlan(groups)
        for g in groups:
            anchor = max(g.nodes, key=lambda t: self.pos[id(t)])
            fp.anchor[id(anchor)] = g
            fp.absorbed.update(id(t) for t in g.nodes)
            if isinstance(g, ProductGroup) and g.src.fa is not None:
                fp.combine_into[id(g.src.fa)] = g
        for g in groups:
            if isinstance(g, AttnGroup):
                g.combined = id(g.fa) not in fp.combine_into
        return fp

    def misplaced(self, fp: FusionPlan):
        """The first group some value of which would be read before it is made, or None: a group is
        emitted at its last node, every node alone at its own place."""
        at = {}
        for key, g in fp.anchor.items():
            for t in g.nodes:
                at[id(t)] = self.pos[key]
        emit = lambda t: at.get(id(t), self.pos.get(id(t), -1))     # noqa: E731
        for g in fp.groups:
            here = emit(g.nodes[0])
            inside = {id(t) for t in g.nodes}
            for t in g.nodes:
                for s in t.src:
                    if id(s) not in inside and (emit(s) >= here or not self.available(s)):
                        return g
                if id(t) in self.made:
                    if any(id(r) not in inside and emit(r) <= here for r in self.readers.get(id(t), [])):
                        return g
        return None


def head_of(g) -> Tensor:
    """The node a group was found from (excluded to plan without it)."""
    return g.muls[0] if isinstance(g, ProductGroup) else g.fa


def plan(target: Target, fragment, off: frozenset[str]) -> FusionPlan:
    """The fused groups of a fragment, each fusion of `off` left out; a group whose values some other
    kernel would read before it is made is planned again without it."""
    if not GROUP_FUSIONS - off:
        return FusionPlan([])
    excluded: set[int] = set()
    while True:
        m = Matcher(target, fragment, off, frozenset(excluded))
        fp = m.plan()
        bad = m.misplaced(fp)
        if bad is None:
            return fp
        excluded.add(id(head_of(bad)))
