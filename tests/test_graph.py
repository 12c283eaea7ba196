"""Graph building: shape errors that name the op and the shapes, structure hashes, and the real
decode-step graphs of both models."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from framework.core.graph import F32, I32, GraphBuildError, GraphBuilder, LeafKind, leaf, structure_hash
from framework.core.graph.dtypes import DType
from framework.model.arch.base import KVCache
from framework.model.default import default_model_path, smollm2_path
from framework.model.model import Model


def build_error(fn) -> str:
    with pytest.raises(GraphBuildError) as err:
        fn()
    assert isinstance(err.value, ValueError)
    return str(err.value)


# ---------------------------------------------------------------------------------------------
# shape errors
# ---------------------------------------------------------------------------------------------

def test_mul_mat_inner_dimension_mismatch():
    b = GraphBuilder()
    w = b.input("w", F32, (24, 32))
    x = b.input("x", F32, (5, 31))
    msg = build_error(lambda: b.mul_mat(w, x))
    assert "mul_mat" in msg and "[24, 32]" in msg and "[5, 31]" in msg
    assert b.nodes == []          # nothing was appended


def test_mul_mat_batch_not_broadcastable():
    b = GraphBuilder()
    a = b.input("a", F32, (2, 8, 16))
    x = b.input("x", F32, (3, 5, 16))
    msg = build_error(lambda: b.mul_mat(a, x))
    assert "mul_mat" in msg and "[2, 8, 16]" in msg and "[3, 5, 16]" in msg


def test_mul_mat_result_shape():
    b = GraphBuilder()
    out = b.mul_mat(b.input("a", F32, (2, 8, 16)), b.input("x", F32, (3, 4, 5, 16)))
    assert out.shape == (3, 4, 5, 8)


@pytest.mark.parametrize("op", ["add", "mul"])
def test_binary_broadcast_failure(op):
    b = GraphBuilder()
    a = b.input("a", F32, (4, 6))
    c = b.input("c", F32, (3, 6))
    msg = build_error(lambda: getattr(b, op)(a, c))
    assert op.upper() in msg and "[4, 6]" in msg and "[3, 6]" in msg
    # tiling a whole number of times is fine: (2, 6) repeats twice over (4, 6)
    assert getattr(b, op)(a, b.input("r", F32, (2, 6))).shape == (4, 6)


def test_binary_operand_larger_than_result_fails():
    b = GraphBuilder()
    msg = build_error(lambda: b.add(b.input("a", F32, (6,)), b.input("c", F32, (4, 6))))
    assert "ADD" in msg and "[6]" in msg and "[4, 6]" in msg


def test_reshape_element_count():
    b = GraphBuilder()
    a = b.input("a", F32, (2, 3))
    msg = build_error(lambda: b.reshape(a, (4, 2)))
    assert "reshape" in msg and "[2, 3]" in msg and "[4, 2]" in msg
    assert "6" in msg and "8" in msg


def test_reshape_of_permuted_tensor():
    b = GraphBuilder()
    a = b.input("a", F32, (2, 3, 4))
    p = b.permute(a, (0, 2, 1))
    assert not p.contiguous and p.shape == (2, 4, 3)
    msg = build_error(lambda: b.reshape(p, (8, 3)))
    assert "reshape" in msg and "[2, 4, 3]" in msg and "contiguous" in msg
    # cont() makes it reshapable; an identity permutation stays contiguous
    assert b.reshape(b.cont(p), (8, 3)).shape == (8, 3)
    assert b.permute(a, (0, 1, 2)).contiguous


def test_reshape_of_permuted_tensor_names_target_shape():
    b = GraphBuilder()
    p = b.permute(b.input("a", F32, (2, 3, 4)), (0, 2, 1))
    assert "[8, 3]" in build_error(lambda: b.reshape(p, (8, 3)))


def test_view_out_of_bounds():
    b = GraphBuilder()
    a = b.input("a", F32, (4, 6))
    msg = build_error(lambda: b.view(a, (2, 6), offset=13))
    assert "view" in msg and "[2, 6]" in msg and "[4, 6]" in msg


def test_flash_attn_ext_head_mismatch():
    b = GraphBuilder()
    q = b.input("q", F32, (3, 6, 16))
    k = b.input("k", F32, (10, 4, 16))
    v = b.input("v", F32, (10, 4, 16))
    msg = build_error(lambda: b.flash_attn_ext(q, k, v, None, 0.25))
    assert "flash_attn_ext" in msg and "[3, 6, 16]" in msg and "[10, 4, 16]" in msg
    assert "6" in msg and "4" in msg


def test_flash_attn_ext_head_dim_and_mask_mismatch():
    b = GraphBuilder()
    q = b.input("q", F32, (3, 4, 16))
    k = b.input("k", F32, (10, 2, 8))
    msg = build_error(lambda: b.flash_attn_ext(q, k, k, None, 0.25))
    assert "flash_attn_ext" in msg and "[3, 4, 16]" in msg and "[10, 2, 8]" in msg
    k = b.input("k2", F32, (10, 2, 16))
    mask = b.input("mask", F32, (3, 9))
    msg = build_error(lambda: b.flash_attn_ext(q, k, k, mask, 0.25))
    assert "flash_attn_ext" in msg and "[3, 9]" in msg and "[3, 10]" in msg


def test_rope_ext_bad_positions():
    b = GraphBuilder()
    x = b.input("x", F32, (5, 2, 16))
    pos = b.input("pos", I32, (4,))
    msg = build_error(lambda: b.rope_ext(x, pos, 16, "normal", 10000.0))
    assert "rope_ext" in msg and "[5, 2, 16]" in msg and "[4]" in msg
    fpos = b.input("fpos", F32, (5,))
    msg = build_error(lambda: b.rope_ext(x, fpos, 16, "normal", 10000.0))
    assert "rope_ext" in msg and "int32" in msg and "[5]" in msg


def test_rope_ext_bad_n_dims_and_mode():
    b = GraphBuilder()
    x = b.input("x", F32, (5, 2, 16))
    pos = b.input("pos", I32, (5,))
    msg = build_error(lambda: b.rope_ext(x, pos, 18, "normal", 10000.0))
    assert "rope_ext" in msg and "18" in msg and "[5, 2, 16]" in msg
    msg = build_error(lambda: b.rope_ext(x, pos, 16, "glm", 10000.0))
    assert "glm" in msg and "normal" in msg and "neox" in msg


def test_unknown_glu_lists_known():
    b = GraphBuilder()
    g = b.input("g", F32, (3, 8))
    msg = build_error(lambda: b.glu(g, g, "reglu"))
    assert "glu" in msg and "reglu" in msg and "swiglu" in msg and "geglu" in msg


def test_glu_shape_mismatch():
    b = GraphBuilder()
    msg = build_error(lambda: b.glu(b.input("g", F32, (3, 8)), b.input("u", F32, (3, 4)), "swiglu"))
    assert "glu" in msg and "[3, 8]" in msg and "[3, 4]" in msg


def test_unknown_unary_lists_known():
    b = GraphBuilder()
    msg = build_error(lambda: b.unary(b.input("x", F32, (3, 8)), "relu"))
    assert "unary" in msg and "relu" in msg and all(k in msg for k in ("gelu", "silu", "tanh"))


def test_get_rows_and_set_rows_errors():
    b = GraphBuilder()
    a = b.input("a", F32, (10, 4))
    msg = build_error(lambda: b.get_rows(a, b.input("rows", F32, (3,))))
    assert "get_rows" in msg and "[10, 4]" in msg and "[3]" in msg
    dst = leaf("cache", F32, (8, 6), LeafKind.CACHE)
    msg = build_error(lambda: b.set_rows(dst, b.input("src", F32, (2, 5)), b.input("r", I32, (2,))))
    assert "set_rows" in msg and "[2, 5]" in msg and "[8, 6]" in msg


def test_use_rejects_a_node():
    b = GraphBuilder()
    n = b.scale(b.input("x", F32, (2,)), 2.0)
    msg = build_error(lambda: b.use(n))
    assert "not a leaf" in msg


# ---------------------------------------------------------------------------------------------
# structure hashes
# ---------------------------------------------------------------------------------------------

def toy_layer(b: GraphBuilder, x, il: int, n_embd=16, n_ff=32, eps=1e-6, wiring="residual", up_dtype=DType.Q8_0):
    """norm -> mul weight -> up -> silu -> down -> residual add, with this layer's own weights."""
    norm_w = leaf(f"blk.{il}.norm.weight", F32, (n_embd,), LeafKind.WEIGHT)
    up_w = leaf(f"blk.{il}.up.weight", up_dtype, (n_ff, n_embd), LeafKind.WEIGHT)
    down_w = leaf(f"blk.{il}.down.weight", DType.Q8_0, (n_embd, n_ff), LeafKind.WEIGHT)
    start = len(b.nodes)
    h = b.mul(b.rms_norm(x, eps, name=f"norm_rms-{il}"), norm_w, name=f"norm-{il}")
    up = b.unary(b.mul_mat(up_w, h, name=f"up-{il}"), "silu", name=f"act-{il}")
    down = b.mul_mat(down_w, up, name=f"down-{il}")
    out = b.add(down, x if wiring == "residual" else h, name=f"out-{il}")
    return out, b.nodes[start:]


def layer_hash(nodes):
    return structure_hash(nodes, [nodes[-1]])


def test_identical_layers_with_different_weights_hash_equal():
    b = GraphBuilder()
    x = b.scale(b.input("x", F32, (3, 64)), 8.0)      # layer inputs are nodes, as in a model
    x0, l0 = toy_layer(b, x, 0, n_embd=64, n_ff=128)
    _, l1 = toy_layer(b, x0, 1, n_embd=64, n_ff=128)
    assert {t.name for t in l0}.isdisjoint({t.name for t in l1})
    w0 = {s.name for n in l0 for s in n.src if s.is_leaf and s.kind == LeafKind.WEIGHT}
    w1 = {s.name for n in l1 for s in n.src if s.is_leaf and s.kind == LeafKind.WEIGHT}
    assert w0 and w1 and w0.isdisjoint(w1)
    assert layer_hash(l0) == layer_hash(l1)
    # independent builders, same structure: same hash
    b2 = GraphBuilder()
    _, l2 = toy_layer(b2, b2.scale(b2.input("other", F32, (3, 64)), 0.5), 7, n_embd=64, n_ff=128)
    assert layer_hash(l2) == layer_hash(l0)


@pytest.mark.parametrize("change", ["shape", "n_tokens", "eps", "wiring", "weight_dtype"])
def test_structure_hash_changes(change):
    def build(**kw):
        b = GraphBuilder()
        x = b.input("x", F32, (kw.pop("n_tokens", 3), 64))
        return layer_hash(toy_layer(b, x, 0, n_embd=64, **kw)[1])

    base = build(n_ff=128)
    assert base == build(n_ff=128)
    changed = {"shape": lambda: build(n_ff=96),
               "n_tokens": lambda: build(n_ff=128, n_tokens=4),
               "eps": lambda: build(n_ff=128, eps=1e-5),
               "wiring": lambda: build(n_ff=128, wiring="from_norm"),
               "weight_dtype": lambda: build(n_ff=128, up_dtype=DType.Q4_0)}[change]
    assert changed() != base


def test_structure_hash_sees_scale_and_outputs():
    b1, b2 = GraphBuilder(), GraphBuilder()
    s1 = b1.scale(b1.input("x", F32, (4,)), 2.0)
    s2 = b2.scale(b2.input("x", F32, (4,)), 3.0)
    assert structure_hash(b1.nodes) != structure_hash(b2.nodes)
    b3 = GraphBuilder()
    x = b3.input("x", F32, (4,))
    a = b3.scale(x, 2.0)
    c = b3.scale(a, 2.0)
    assert structure_hash(b3.nodes, [c]) != structure_hash(b3.nodes, [a, c])
    assert s1.name == s2.name  # names alone never decide


def test_structure_hash_ignores_names_but_not_external_kind():
    def build(name, kind):
        b = GraphBuilder()
        x = b.use(leaf(name, F32, (4, 8), kind)) if kind != LeafKind.INPUT else b.input(name, F32, (4, 8))
        b.rms_norm(x, 1e-6, name=f"n_{name}")
        return structure_hash(b.nodes)

    assert build("a", LeafKind.INPUT) == build("zzz", LeafKind.INPUT)
    assert build("a", LeafKind.INPUT) != build("a", LeafKind.CACHE)


# ---------------------------------------------------------------------------------------------
# the real decode-step graphs
# ---------------------------------------------------------------------------------------------

LAYER_SUFFIX = re.compile(r"-(\d+)(?:_rms)?$")   # "Qcur-3", and norm() names its RMS node "attn_norm-3_rms"
NON_LAYER = {"inp_embd", "inp_scaled", "out_rows", "result_norm_rms", "result_norm", "result_output"}


@pytest.fixture(scope="session")
def smollm2():
    return Model(smollm2_path())


@pytest.fixture(scope="session")
def gemma3():
    return Model(default_model_path())


@pytest.fixture(scope="session", params=["smollm2", "gemma3"])
def decode_step(request):
    model = request.getfixturevalue(request.param)
    graph, inp = model.build_step(1, 256, 1, KVCache(model.hp, 512))
    layers = defaultdict(list)
    for n in graph.nodes:
        m = LAYER_SUFFIX.search(n.name)
        if m:
            layers[int(m.group(1))].append(n)
        else:
            assert n.name in NON_LAYER, f"node {n.name} belongs to no layer"
    return request.param, model, graph, inp, dict(layers)


def test_decode_graph_shape(decode_step):
    name, model, graph, inp, layers = decode_step
    assert len(graph.nodes) > 0
    assert graph.meta["n_tokens"] == 1 and graph.meta["n_kv"] == 256
    (logits,) = graph.outputs
    assert logits.shape == (1, model.hp.n_vocab)
    assert logits is graph.nodes[-1] and logits.op == "MUL_MAT"
    assert model.hp.n_vocab == {"smollm2": 49152, "gemma3": 262144}[name]
    assert inp.tokens.shape == (1,) and inp.mask.shape == (1, 256)
    assert sorted(layers) == list(range(model.hp.n_layer))
    sizes = {len(v) for v in layers.values()}
    assert len(sizes) == 1                         # every layer has the same node count
    # every node's sources are leaves or earlier nodes: a valid execution order
    seen = set()
    for n in graph.nodes:
        assert all(s.is_leaf or id(s) in seen for s in n.src), n.name
        seen.add(id(n))


def weight_dtypes(nodes) -> tuple[str, ...]:
    """The dtypes of the weights a layer reads, in order of use."""
    return tuple(s.dtype.name for n in nodes for s in n.src if s.is_leaf and s.kind == LeafKind.WEIGHT)


def group_layers(model, layers):
    """Layers grouped by what decides their structure: the kind (sliding or global) and the
    weight dtypes (Gemma's Q4_K_M file mixes Q8_0/Q5_0 attn_v and Q6_K/Q4_K ffn_down by layer,
    and a weight's dtype is part of the structure hash)."""
    groups = defaultdict(list)
    for il, nodes in sorted(layers.items()):
        groups[(model.hp.swa_layers[il], weight_dtypes(nodes))].append(il)
    return dict(groups)


def test_decode_graph_layer_hashes(decode_step):
    name, model, graph, inp, layers = decode_step
    hashes = {il: layer_hash(nodes) for il, nodes in layers.items()}
    groups = group_layers(model, layers)
    group_hashes = {}
    for key, members in groups.items():
        assert len({hashes[il] for il in members}) == 1, f"layers {members} ({key}) hash differently"
        group_hashes[key] = hashes[members[0]]
    assert len(set(group_hashes.values())) == len(groups)     # different structure: different hash
    if name == "smollm2":
        assert len(groups) == 1 and len(set(hashes.values())) == 1
        return
    swa = model.hp.swa_layers
    assert [il for il in range(model.hp.n_layer) if not swa[il]] == [5, 11, 17]
    # a sliding and a global layer reading weights of the same dtypes still hash differently
    pairs = [(s, g) for s in groups for g in groups if s[0] and not g[0] and s[1] == g[1]]
    assert pairs, "expected a sliding and a global layer with the same weight dtypes"
    for s, g in pairs:
        assert group_hashes[s] != group_hashes[g]
    # and sliding layers 0, 1 and 4 (same weight dtypes) hash equal
    assert hashes[0] == hashes[1] == hashes[4]


def test_gemma3_layer_kinds_differ_in_rope_base_and_mask(gemma3):
    graph, inp = gemma3.build_step(1, 256, 1, KVCache(gemma3.hp, 512))
    by_name = {n.name: n for n in graph.nodes}
    hp = gemma3.hp
    assert hp.rope_base != hp.rope_base_swa
    for il in range(hp.n_layer):
        rope = by_name[f"Qcur_rope-{il}"]
        attn = by_name[f"kqv-{il}"]
        if hp.swa_layers[il]:
            assert rope.params["freq_base"] == hp.rope_base_swa == 10000.0
            assert attn.src[3] is inp.mask_swa
        else:
            assert rope.params["freq_base"] == hp.rope_base
            assert attn.src[3] is inp.mask
        assert rope.params["mode"] == "neox"
    # with one rope base everywhere, the only difference left between the kinds is which
    # (same-shaped) mask input is read, which the structure hash does not see: layers then
    # hash alike whenever their weight dtypes agree
    for n in graph.nodes:
        if n.op == "ROPE":
            n.params["freq_base"] = hp.rope_base
    layers = defaultdict(list)
    for n in graph.nodes:
        m = LAYER_SUFFIX.search(n.name)
        if m:
            layers[int(m.group(1))].append(n)
    by_dtypes = defaultdict(set)
    for nodes in layers.values():
        by_dtypes[weight_dtypes(nodes)].add(layer_hash(nodes))
    assert all(len(h) == 1 for h in by_dtypes.values())


def test_smollm2_layers_use_normal_rope_and_gqa(smollm2):
    graph, _ = smollm2.build_step(1, 256, 1, KVCache(smollm2.hp, 512))
    hp = smollm2.hp
    by_name = {n.name: n for n in graph.nodes}
    q = by_name["Qcur_rope-0"]
    assert q.params["mode"] == "normal" and q.shape == (1, hp.n_head, hp.head_dim)
    attn = by_name["kqv-0"]
    assert attn.src[1].shape == (256, hp.n_head_kv, hp.head_dim)
    assert hp.n_head % hp.n_head_kv == 0 and hp.n_head != hp.n_head_kv


def test_prefill_and_decode_graphs_hash_differently(smollm2):
    cache = KVCache(smollm2.hp, 512)
    g1, _ = smollm2.build_step(1, 256, 1, cache)
    g2, _ = smollm2.build_step(4, 256, 1, cache)
    g3, _ = smollm2.build_step(1, 256, 1, cache)
    assert g1.structure_hash() == g3.structure_hash()
    assert g1.structure_hash() != g2.structure_hash()
