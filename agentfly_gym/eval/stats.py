"""The statistics of an evaluation: pass@k and bootstrap confidence intervals.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
section 2.1 and its figure 3): with ``n`` samples of a task of which ``c`` succeeded,

    pass@k = 1 - C(n - c, k) / C(n, k)

computed as the product ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``, which never forms the binomial
coefficients (they overflow a float past n ~ 1000) and is exact for ``n - c < k`` (then 1.0).

Intervals are percentile bootstrap intervals (Efron & Tibshirani 1993, "An Introduction to the Bootstrap",
section 13.3) from a seeded NumPy generator, so the same results give the same interval every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..errors import ConfigError
from ..limits import check_int

__all__ = ["DEFAULT_CONFIDENCE", "DEFAULT_RESAMPLES", "bootstrap_ci", "pass_at_k"]

#: Bootstrap resamples per interval.
DEFAULT_RESAMPLES = 2000
#: The confidence of an interval (0.95: the 2.5th and 97.5th percentiles of the resampled statistic).
DEFAULT_CONFIDENCE = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task: the chance that at least one of ``k`` samples drawn without replacement
    from the ``n`` played succeeds, ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021; see the module docstring).

    Args:
        n: samples played (>= 1).
        c: samples that succeeded (0 <= c <= n).
        k: samples drawn (1 <= k <= n).

    Returns:
        A float in [0, 1]: 0.0 when ``c == 0``, 1.0 when ``n - c < k`` (every draw of k holds a success).

    Raises:
        ConfigError: a count that is not an integer, ``c > n``, or ``k`` outside ``[1, n]``.

    >>> pass_at_k(2, 1, 1)
    0.5
    >>> pass_at_k(5, 1, 5)
    1.0
    """
    n, c, k = check_int("n", n), check_int("c", c, minimum=0), check_int("k", k, minimum=0)
    if c > n:
        raise ConfigError(f"c={c} successes out of n={n} samples: c must be <= n")
    if not 1 <= k <= n:
        raise ConfigError(f"k={k} must be in [1, n={n}]: pass@k needs at least k samples of the task")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def bootstrap_ci(values: Sequence[float], *, statistic: Callable[..., float] | None = None,
                 confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
                 seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of ``statistic`` (the mean by default) over ``values``.

    Args:
        values: the observations (length m >= 1); each resample draws m of them with replacement.
        statistic: a function of a 2-D NumPy array ``(resamples, m)`` returning one value per row
            (default: the row mean).
        confidence: in (0, 1); 0.95 gives the 2.5th and 97.5th percentiles.
        resamples: how many resamples (>= 1).
        seed: the NumPy generator's seed.

    Returns:
        ``(low, high)``; ``(v, v)`` for one observation or identical ones; ``(nan, nan)`` for none.

    Raises:
        ConfigError: ``confidence`` outside (0, 1) or ``resamples`` < 1.
    """
    import numpy as np

    if not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ConfigError(f"confidence={confidence!r} must be in (0, 1)")
    check_int("resamples", resamples)
    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = data[rng.integers(0, data.size, size=(resamples, data.size))]
    stats = statistic(draws) if statistic is not None else draws.mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(np.asarray(stats, dtype=float), [alpha, 1 - alpha])
    return float(low), float(high)
