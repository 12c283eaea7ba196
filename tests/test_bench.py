"""`framework bench`'s arithmetic: engines taking turns, spreads, and when a ratio means something.
(The README's `make bench` line is run by tests/test_readme.py; speed itself is never a test.)"""

from framework.bench import Spread, interleave, ratio_cells


def test_engines_take_turns_after_one_warm_up_run_each():
    order = []

    def engine(name, values):
        it = iter(values)
        return lambda: order.append(name) or {"decode": next(it)}

    got = interleave({"framework": engine("framework", [1, 10, 11, 12]),
                      "llama.cpp": engine("llama.cpp", [2, 20, 21, 22])}, repeats=3)
    assert order == ["framework", "llama.cpp"] * 4            # alternating, so a slow period hits both
    assert got["framework"]["decode"].values == [10, 11, 12]    # the warm-up round is not counted
    assert got["llama.cpp"]["decode"].values == [20, 21, 22]


def test_a_ratio_is_significant_only_when_the_spreads_do_not_overlap():
    ours, quiet, noisy = Spread([10.0, 11.0, 12.0]), Spread([20.0, 21.0, 22.0]), Spread([9.0, 22.0, 66.0])
    assert Spread([22.2, 40.0, 66.0]).cells() == ["22.2", "40.0", "66.0"]        # min, median, max
    cells, verdict = ratio_cells(ours, quiet)
    assert cells == ["0.45x", "0.52x", "0.60x"] and verdict == "significant"
    cells, verdict = ratio_cells(ours, noisy)
    assert cells == ["0.15x", "0.50x", "1.33x"] and verdict == "not significant (spreads overlap)"
