"""The sampler's cuts (min-p) and its hooks: a token mask applied to every step, an observer told of each."""

from __future__ import annotations

import numpy as np
import pytest

from framework.runtime.sampling import Sampler, SamplingParams

LOGITS = np.log(np.array([0.5, 0.3, 0.12, 0.08], dtype=np.float32))


def test_min_p_drops_tokens_less_likely_than_that_share_of_the_likeliest():
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=1))
    dist = s.distribution(LOGITS)
    assert dist[3] == 0.0 and dist[2] > 0.0               # 0.08 < 0.2 * 0.5 <= 0.12
    assert dist[:3] == pytest.approx(np.array([0.5, 0.3, 0.12]) / 0.92)
    assert {s(LOGITS) for _ in range(200)} == {0, 1, 2}
    with pytest.raises(ValueError, match="min-p"):
        SamplingParams(min_p=1.5).check()


class EvenOnly:
    """A mask that allows even ids only, and records what it was told."""

    def __init__(self, n: int):
        self.n, self.accepted = n, []

    def allowed(self) -> np.ndarray:
        return np.arange(self.n) % 2 == 0

    def accept(self, token: int) -> None:
        self.accepted.append(token)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_mask_forbids_tokens_greedy_or_sampled_and_is_told_each_choice(temperature):
    logits = np.array([0.0, 5.0, 1.0, 4.0, 0.5, 9.0], dtype=np.float32)      # padding past the mask's 4 ids
    mask, seen = EvenOnly(4), []
    s = Sampler(SamplingParams(temperature=temperature, top_k=0, top_p=1.0, seed=3), mask=mask,
                observe=lambda row, token: seen.append((row.copy(), token)))
    picks = [s(logits) for _ in range(50)]
    assert set(picks) <= {0, 2} and (temperature > 0 or set(picks) == {2})
    assert mask.accepted == picks and [t for _, t in seen] == picks
    assert np.isneginf(seen[0][0][[1, 3, 4, 5]]).all() and seen[0][0][2] == 1.0
