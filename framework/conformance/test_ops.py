"""The conformance tests: every case on every selected device, against the core's reference kernels.

For each case and device:
  * ``test_matches_cpu_reference``: the device runs the case through make_plan + Executor; when it
    accepts every node, every output must have the node's shape, be float32 and finite, and be within
    the case's NMSE threshold of the reference kernels' output (framework.core.graph.reference, the
    kernels the CPU device runs) for the same graph and values. When it refuses a node, the test is
    skipped with the device's verdict (code and reason).
  * ``test_deterministic``: the same compiled program run twice gives bit-identical outputs.
  * ``test_verdicts_are_well_formed``: every supports_op answer is a Verdict, a refusal has a code and
    a reason, the answer does not change when asked again, and a weight type outside the device's
    declared ``Limits.dtypes`` is refused.

Every verdict is asked the way the planner asks it (``framework.core.scheduler.verdicts.ask``), so the
declared data (``refused_ops``, ``supported_ops``, ``Limits.dtypes``) gives the suite and a real run the
same answer, and an answer the contract does not allow fails with the framework's message.
"""

from __future__ import annotations

import numpy as np
import pytest

from framework.conformance.cases import (
    EXTRA_WEIGHT_TYPES,
    NMSE_DEFAULT,
    NMSE_MAX,
    WEIGHT_TYPES,
    Built,
    Case,
    all_cases,
    nmse,
    ops_of,
)
from framework.contract import Verdict
from framework.core.graph import F32, GLU_OPS, I32, OPS, ROPE_MODES, UNARY_OPS, Graph, LeafKind, Tensor, leaf
from framework.core.graph import ops as op_table
from framework.core.graph.interpreter import evaluate
from framework.core.graph.ops import UnknownOpError
from framework.core.graph.quants import dequantize
from framework.core.scheduler import Executor, make_plan
from framework.core.scheduler.errors import PluginContractError
from framework.core.scheduler.verdicts import ask

CASES = all_cases()

_built: dict[str, Built] = {}
_reference: dict[str, list[np.ndarray]] = {}


def built(case: Case) -> Built:
    """One build per case per session, shared by the reference and every device."""
    if case.id not in _built:
        _built[case.id] = case.build()
    return _built[case.id]


def run(device, b: Built, times: int = 2) -> list[list[np.ndarray]]:
    """Plan the case on this device alone and run it `times` times with one executor: one load of the
    weights, one compiled program, fresh copies of the inputs every time."""
    plan = make_plan(b.graph, [device])
    elsewhere = [n.name for n in b.graph.nodes if plan.device_of(n) != device.name]
    assert not elsewhere, f"the planner put {elsewhere} off {device.name}"
    ex = Executor([device], b.weight_bytes)
    # copy at once: an output may alias device memory the next run writes (a view of the KV cache)
    return [[np.array(o, copy=True) for o in ex.run(plan, b.fresh_inputs())] for _ in range(times)]


_runs: dict[tuple[str, str], list[list[np.ndarray]]] = {}


def runs_on(device, case: Case) -> list[list[np.ndarray]]:
    """Two runs of the case's program on the device; shared by the tests of one session, so that a
    device whose compile is slow compiles each case once."""
    key = (device.name, case.id)
    if key not in _runs:
        _runs[key] = run(device, built(case))
    return _runs[key]


def reference(case: Case) -> list[np.ndarray]:
    """The case's outputs on the reference kernels, from the same weight bytes and input values."""
    if case.id not in _reference:
        b = built(case)
        values = {**b.fresh_inputs(), **{id(t): dequantize(b.weights[t.name], t.dtype, t.shape)
                                         for t in b.graph.leaves if t.kind == LeafKind.WEIGHT}}
        _reference[case.id] = evaluate(b.graph, values)
    return _reference[case.id]


def verdict(device, node: Tensor) -> Verdict:
    """The verdict the planner gets, through the framework's one check (framework.core.scheduler.verdicts.ask:
    availability, refused_ops, the op table, supported_ops, Limits.dtypes, then supports_op). An answer the
    contract does not allow (a bare bool, an exception) fails the test with the framework's own message."""
    try:
        return ask(device, node)
    except PluginContractError as e:
        pytest.fail(str(e), pytrace=False)


def verdicts(device, graph: Graph) -> list[tuple[Tensor, Verdict]]:
    return [(n, verdict(device, n)) for n in graph.nodes]


def skip_unless_accepted(device, b: Built) -> None:
    """Skip, quoting the verdicts, when the device refuses a node of the case (the planner would not give
    it the node either)."""
    refused = []
    for node, v in verdicts(device, b.graph):
        if not v.ok:
            refused.append(f"{node.describe()} -> {v.code}: {v.reason}")
    if refused:
        more = f" (and {len(refused) - 2} more)" if len(refused) > 2 else ""
        pytest.skip(f"not supported by {device.name} (its verdict): {'; '.join(refused[:2])}{more}")


# ------------------------------------------------------------------------------------------------------
# per case, per device
# ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_cpu_reference(device, case):
    """supports_op honesty: a device that accepts every node of a case must compute it correctly."""
    b = built(case)
    skip_unless_accepted(device, b)
    outs = runs_on(device, case)[0]
    refs = reference(case)
    assert len(outs) == len(b.graph.outputs)
    for i, (out, ref, t) in enumerate(zip(outs, refs, b.graph.outputs)):
        where = f"{device.name}, case {case.id}, output {i} {t.describe()}"
        assert isinstance(out, np.ndarray), f"{where}: to_host gave {type(out).__name__}, not a numpy array"
        assert out.shape == t.shape, f"{where}: shape {out.shape}, expected {t.shape}"
        if t.dtype == I32:          # indices (ARGMAX): exactly the reference's
            assert out.dtype == np.int32, f"{where}: dtype {out.dtype}, expected int32"
            assert np.array_equal(out, ref), f"{where}: {out.ravel()[:8]} against the reference's {ref.ravel()[:8]}"
            continue
        assert out.dtype == np.float32, f"{where}: dtype {out.dtype}, expected float32"
        bad = int(np.size(out) - np.count_nonzero(np.isfinite(out)))
        assert bad == 0, f"{where}: {bad} of {out.size} values are not finite (the CPU reference's all are)"
        err = nmse(out, ref)
        if not err <= b.tolerance:
            diff = np.abs(out.astype(np.float64) - ref)
            at = np.unravel_index(int(np.argmax(diff)), diff.shape)
            pytest.fail(f"{where}: NMSE {err:.3e} > {b.tolerance:.0e} (ggml's threshold for {case.op}); "
                        f"largest error {diff[at]:.3e} at {tuple(int(x) for x in at)}: {out[at]!r} vs reference "
                        f"{ref[at]!r}\n{b.describe()}", pytrace=False)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_deterministic(device, case):
    """The same program, run twice on the same values, gives bit-identical outputs."""
    b = built(case)
    skip_unless_accepted(device, b)
    first, second = runs_on(device, case)
    for i, (x, y) in enumerate(zip(first, second)):
        if not np.array_equal(x, y, equal_nan=True):
            n = int(np.count_nonzero(x != y))
            pytest.fail(f"{device.name}, case {case.id}, output {i}: the second run differs from the first in "
                        f"{n} of {x.size} values (max difference {np.nanmax(np.abs(x - y)):.3e})", pytrace=False)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_verdicts_are_well_formed(device, case):
    """Every answer is a Verdict; a refusal carries a code and a reason; the answer is stable; a weight
    type the device does not declare in Limits.dtypes is refused."""
    b = built(case)
    declared = device.limits.dtypes
    for node, v in verdicts(device, b.graph):
        what = f"the verdict of {device.name} on {node.describe()}"
        assert isinstance(v.ok, bool), f"{what}: Verdict.ok is {v.ok!r}, not a bool"
        if not v.ok:
            assert isinstance(v.code, str) and v.code and v.code != "ok", f"{what}: refusal without a code: {v!r}"
            assert isinstance(v.reason, str) and v.reason.strip(), f"{what}: refusal without a reason: {v!r}"
        again = verdict(device, node)
        assert again == v, f"{what} was {v!r}, then {again!r}"
        weight_types = {s.dtype.name for s in node.src if s.is_leaf and s.kind == LeafKind.WEIGHT}
        if declared is not None and v.ok and not weight_types <= set(declared):
            pytest.fail(f"{what} accepts a node reading a {'/'.join(sorted(weight_types - set(declared)))} weight, "
                        f"but the device's Limits.dtypes declares only {sorted(declared)}", pytrace=False)


# ------------------------------------------------------------------------------------------------------
# per device
# ------------------------------------------------------------------------------------------------------

def _node(op: str) -> Tensor:
    x = leaf("x", F32, (4, 8), LeafKind.INPUT)
    return Tensor(name=f"{op.lower()}-0", dtype=F32, shape=(4, 8), op=op, src=(x,))


def test_refuses_an_op_that_does_not_exist(device):
    v = verdict(device, _node("CONFORMANCE_NO_SUCH_OP"))
    assert isinstance(v, Verdict) and not v.ok, f"{device.name} accepts an op that does not exist: {v!r}"
    assert v.code and v.code != "ok" and v.reason.strip(), f"{device.name}: refusal without code or reason: {v!r}"


def test_answers_gated_delta_net_with_a_verdict(device):
    """An op no kernel of the suite covers (Qwen3-Next's): whatever the answer, it is a Verdict."""
    v = verdict(device, _node("GATED_DELTA_NET"))
    if not v.ok:
        assert v.code and v.code != "ok" and v.reason.strip(), f"{device.name}: refusal without code or reason: {v!r}"


# ------------------------------------------------------------------------------------------------------
# the reference and the suite itself
# ------------------------------------------------------------------------------------------------------

def test_reference_knows_no_op_outside_the_table():
    """An op the table does not hold has no reference kernel: asking for one names the table's ops."""
    node = _node("CONFORMANCE_NO_SUCH_OP")
    with pytest.raises(UnknownOpError, match="CONFORMANCE_NO_SUCH_OP.*op table.*MUL_MAT"):
        op_table.bind(node)
    with pytest.raises(UnknownOpError):
        evaluate(Graph(nodes=[node], leaves=list(node.src), outputs=[node]), {id(node.src[0]): np.zeros((4, 8))})


def test_metric_detects_errors():
    ref = np.linspace(1.0, 2.0, 64)
    assert nmse(ref.astype(np.float32), ref) < 1e-14
    assert nmse(ref * (1 + 1e-3), ref) > NMSE_DEFAULT          # a 0.1 % error fails the default threshold
    assert nmse(ref * (1 + 1e-2), ref) < NMSE_MAX["MUL_MAT"]   # 1 % passes the matrix-product one
    assert nmse(ref * (1 + 1e-1), ref) > NMSE_MAX["MUL_MAT"]
    assert nmse(np.zeros(3), np.zeros(3)) == 0.0 and nmse(np.ones(3), np.zeros(3)) == float("inf")
    assert not nmse(np.array([np.nan, 1.0]), np.ones(2)) <= 1.0


def test_cases_cover_every_op():
    """Every op of the table, every unary, GLU and rope mode, and every weight type for GET_ROWS and for
    MUL_MAT in decode and prefill, has a case."""
    covered = ops_of(CASES)
    # the builder's transpose() emits PERMUTE; TRANSPOSE is only a name for graphs made elsewhere
    assert set(OPS) - {"TRANSPOSE"} <= covered, sorted(set(OPS) - {"TRANSPOSE"} - covered)
    params = {(n.op, n.params.get("op") or n.params.get("mode")) for c in CASES for n in c.build().graph.nodes}
    for op, kinds in (("UNARY", UNARY_OPS), ("GLU", GLU_OPS), ("ROPE", ROPE_MODES)):
        assert {(op, k) for k in kinds} <= params, f"{op}: {sorted(set(kinds) - {k for o, k in params if o == op})}"
    ids = [c.id for c in CASES]
    for q in WEIGHT_TYPES:
        for prefix in (f"GET_ROWS-{q.name}-decode", f"GET_ROWS-{q.name}-prefill", f"MUL_MAT-{q.name}-decode",
                       f"MUL_MAT-{q.name}-prefill"):
            assert any(i.startswith(prefix) for i in ids), prefix
    assert set(EXTRA_WEIGHT_TYPES).isdisjoint(WEIGHT_TYPES)


def test_cases_are_reproducible():
    """A case is the same values every time it is built (seeded per case id, independent of order)."""
    for case in (CASES[0], CASES[len(CASES) // 2], CASES[-1]):
        one, two = case.build(), case.build()
        assert [v.tobytes() for v in one.inputs.values()] == [v.tobytes() for v in two.inputs.values()]
        assert {k: v.tobytes() for k, v in one.weights.items()} == {k: v.tobytes() for k, v in two.weights.items()}
