"""Conformance suite for backend plugins, after ggml's test-backend-ops.

Run it against your plugin's device (after ``pip install`` of your plugin, in the same environment)::

    pytest --pyargs framework.conformance --device NAME

``NAME`` is a device name as ``framework backends`` lists it (``example:0``, ``cpu``; the aliases
``cpu``, ``gpu``, ``npu``, ``accel`` pick the first available device of that type). Repeat the
option, or give a comma-separated list, for several devices; without it, every available device is
tested. An unknown or unavailable name fails the run with the registry's list of devices. Add
``-rs`` to see why each skipped case was skipped, ``-x`` to stop at the first failure, ``-k MUL_MAT``
to run one op's cases. ``FRAMEWORK_CONFORMANCE_SEED=<int>`` draws other random values and shapes.
``--device`` comes from the pytest plugin ``framework.conformance.pytest_plugin`` (entry point group
``pytest11``, installed with framework); if pytest answers "unrecognized arguments: --device" (an
install without that entry point, or ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``), name it:
``pytest -p framework.conformance.pytest_plugin --pyargs framework.conformance --device NAME``.

What it checks, for every case (``cases.py``: one tiny graph per op -- GET_ROWS, MUL_MAT with every
weight type in decode and prefill, ADD, MUL, SCALE, UNARY, GLU, RMS_NORM, SOFT_MAX, FLASH_ATTN_EXT,
ROPE, SET_ROWS into a KV-cache leaf, VIEW, RESHAPE, PERMUTE, CONT -- with fixed shapes taken from the
models, plus a sweep of random shapes drawn from a seeded generator) on every selected device:

* the device runs the graph through the framework's own path (``make_plan(graph, [device])`` and
  ``Executor``: ``load_weight`` on the raw GGUF bytes, ``alloc`` of the cache, ``compile``,
  ``program.run``, ``to_host``), and the core's reference kernels (``framework.core.graph.reference``)
  compute the same graph on the same values; the outputs must have the right shape, be float32 and
  finite, and their normalised mean squared error ``sum((out - ref)^2) / sum(ref^2)`` must be at most
  ggml's threshold for the op, from the op table: 1e-7, 5e-4 for MUL_MAT and FLASH_ATTN_EXT, 1e-6 for
  SOFT_MAX (``docs/ops.md`` says why);
* a case with a node the device refuses (``supports_op`` answers ``Verdict.no``) is reported as
  SKIPPED, with the device's verdict code and reason in the skip message: that is the honest "not
  supported" outcome, not a failure. A device that accepts every node of a case must pass it
  ("supports_op honesty"): a wrong result, or an error while loading, compiling or running, fails;
* every ``supports_op`` answer is a ``Verdict`` (never a bare bool), a refusal has a non-empty code
  and reason, asking twice gives the same answer, and a node reading a weight type outside the
  device's ``Limits.dtypes`` is refused; an op that does not exist is refused;
* the same program run twice gives bit-identical results (determinism).

The reference is the op table's kernels (numpy in float32), which the CPU device also runs: tested
against them, it passes trivially; the kernels themselves are tested against float64 references in
the project's test suite.
"""
