"""Gaussian round sampling against the exact distribution of what it keeps."""
import math

import numpy as np

from peer_rl.data.round_sampling import gaussian_round_sample


def kept_round_pmf(n_rounds: int, mu: float, sigma: float) -> np.ndarray:
    """P(round r), r = 1..n_rounds, of one kept draw: a normal draw rounded to r, conditioned
    on landing in [1, n_rounds], i.e. the normal's mass on [r - 1/2, r + 1/2) renormalised."""
    def cdf(x):
        return 0.5 * (1 + math.erf((x - mu) / (sigma * math.sqrt(2))))

    mass = np.array([cdf(r + 0.5) - cdf(r - 0.5) for r in range(1, n_rounds + 1)])
    return mass / mass.sum()


def test_one_round_follows_the_rounded_truncated_normal_of_sigma_n_over_4():
    """20 rounds, one pick a dialogue: mu = 10, sigma = 5, kept in [1, 20]. The kept picks'
    std is ~4.40, not sigma: the truncation narrows it (sigma = 20/3 would give ~4.95). The
    tolerances are 4 standard errors at 20,000 picks."""
    n, picks = 20_000, 20
    rng = np.random.default_rng(0)
    got = np.array([r for _ in range(n) for r in gaussian_round_sample(picks, 1, rng)])
    assert len(got) == n
    p, r = kept_round_pmf(picks, 10.0, 5.0), np.arange(1, picks + 1)
    mean = float((p * r).sum())
    sd = math.sqrt(float((p * (r - mean) ** 2).sum()))
    kurtosis = float((p * (r - mean) ** 4).sum()) / sd ** 4
    assert abs(mean - 10.11) < 0.01 and abs(sd - 4.40) < 0.01   # the oracle itself, by value
    assert abs(got.mean() - mean) < 4 * sd / math.sqrt(n)
    # standard error of a sample std: sd * sqrt((kurtosis - 1) / (4 n))
    assert abs(got.std() - sd) < 4 * sd * math.sqrt((kurtosis - 1) / (4 * n))
    # and round by round: Pearson's chi-square over the 20 rounds, below the 1 - 1e-4 quantile
    # of chi-square with 19 degrees of freedom (50.80, scipy.stats.chi2.ppf)
    counts = np.bincount(got, minlength=picks + 1)[1:]
    assert float(((counts - n * p) ** 2 / (n * p)).sum()) < 50.80
