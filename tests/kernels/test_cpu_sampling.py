"""Native inverse-CDF sampling (kernels/cpu_sampling.c) against a float64 reference CDF."""
from __future__ import annotations

import pytest
import torch

from kvserve.kernels import cpu_native

pytestmark = pytest.mark.skipif(not cpu_native.available(), reason="no C compiler for the native kernels")


def _reference_cdf(row: torch.Tensor) -> torch.Tensor:
    mass = torch.where(torch.isinf(row), 0.0, (row.double() - row.max().double()).exp())
    return mass.cumsum(0)


@pytest.mark.parametrize("vocab", [1, 7, 511, 512, 513, 4099, 49152])
def test_each_draw_lands_where_the_reference_cdf_puts_it(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(12, vocab, generator=g) * 3
    removed = torch.rand(12, vocab, generator=g) < 0.5
    removed[:, 0] = False  # at least one token per row keeps its mass
    logits[removed] = float("-inf")
    u = torch.rand(12, generator=g, dtype=torch.float64)
    u[0], u[1] = 0.0, 1.0 - 2.0 ** -53  # both ends of the unit interval
    ids = cpu_native.sample_rows(logits, u)
    assert ids is not None and ids.dtype == torch.int64
    for r in range(12):
        i = int(ids[r])
        assert 0 <= i < vocab and not torch.isinf(logits[r, i]), (r, i)
        cdf = _reference_cdf(logits[r])
        target = float(u[r]) * float(cdf[-1])
        tol = 1e-5 * float(cdf[-1])
        below = float(cdf[i - 1]) if i else 0.0
        assert below - tol <= target <= float(cdf[i]) + tol, (r, i, below, target, float(cdf[i]))


def test_strided_rows_and_the_frequencies_of_many_draws():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    wide = torch.full((4000, 6), 123.0)  # a row stride past the vocabulary: the extra columns are never read
    wide[:, :4] = probs.log()
    u = torch.rand(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(cpu_native.sample_rows(wide[:, :4], u), minlength=4)
    assert counts[1] == 0
    for token in (0, 2, 3):
        assert abs(float(counts[token]) / 4000 - float(probs[token])) < 0.03


def test_rows_without_finite_mass_get_minus_one():
    logits = torch.tensor([[float("-inf")] * 5, [0.0, float("nan"), 1.0, 0.0, 0.0], [0.0, float("inf"), 0, 0, 0]])
    assert cpu_native.sample_rows(logits, torch.full((3,), 0.5, dtype=torch.float64)).tolist() == [-1, -1, -1]


def test_shapes_it_does_not_serve_fall_back():
    assert cpu_native.sample_rows(torch.zeros(2, 4, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)) is None
    assert cpu_native.sample_rows(torch.zeros(2, 4), torch.zeros(2)) is None  # float32 uniforms
    assert cpu_native.sample_rows(torch.zeros(1, 1024 * 512 + 1), torch.zeros(1, dtype=torch.float64)) is None


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 100, 49152])
def test_argmax_rows_answers_as_torch_argmax(vocab):
    """Ties (small integers repeat), NaNs before and after the largest value, rows of -inf only and
    +inf, over vocabularies off and on the vector width, with a row stride past the vocabulary."""
    g = torch.Generator().manual_seed(vocab)
    wide = torch.randint(-4, 5, (64, vocab + 3), generator=g).float()
    logits = wide[:, :vocab]
    for r in range(0, 64, 4):
        logits[r, int(torch.randint(0, vocab, (1,), generator=g))] = float("nan")
    logits[1] = float("-inf")
    logits[2, -1] = float("inf")
    logits[3, 0] = float("nan")
    ids = cpu_native.argmax_rows(logits)
    assert ids is not None and ids.dtype == torch.int64
    assert ids.tolist() == logits.argmax(dim=-1).tolist()


def test_argmax_rows_of_random_logits_and_what_it_does_not_serve():
    logits = torch.randn(16, 49152, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cpu_native.argmax_rows(logits), logits.argmax(dim=-1))
    assert cpu_native.argmax_rows(logits.double()) is None
    assert cpu_native.argmax_rows(logits.t()) is None  # no unit column stride
