"""Log-spaced age buckets and the reuse-rate-by-age estimate PACE ranks blocks by."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

PRIOR_WEIGHT = 32.0  # pseudo-episodes pulling a sparse class toward its parent class
SUB_BUCKETS = 4  # age buckets per octave
NUM_BUCKETS = 40 * SUB_BUCKETS


def bucket(age: int) -> int:
    """Log-spaced age bucket, SUB_BUCKETS per power of two."""
    if age < SUB_BUCKETS:
        return age
    high = age.bit_length() - 1
    frac = (age >> (high - 2)) & 3 if high >= 2 else 0
    return min(high * SUB_BUCKETS + frac, NUM_BUCKETS - 1)


TABLE_AGES = 1 << 16
BUCKET_OF_AGE = [bucket(age) for age in range(TABLE_AGES)]  # the hot path's lookup


def bucket_floor(b: int) -> int:
    """The smallest age in bucket b."""
    if b < 2 * SUB_BUCKETS:  # buckets 4..7 are unused: ages 4..7 fall in 8..11
        return min(b, SUB_BUCKETS)
    high, frac = divmod(b, SUB_BUCKETS)
    return (1 << high) + (frac << (high - 2))


_FLOORS = [bucket_floor(b) for b in range(NUM_BUCKETS)]


def row_scores(reuse: list[float], end: list[float], ends: list[int], prior: list[float] | None,
                horizon: int, alive: list[float] | None = None) -> list[float]:
    """Expected reuses per touch of cache time over the horizon, given survival to bucket b:
    reuses in ages [a, a + T] over the time those reuses wait plus T for every other survivor.

    `alive[b]` counts open episodes (blocks resident or remembered, not reused yet) whose current
    age is in bucket b. They are right-censored: each adds the time it has waited so far inside
    the window (T once it is past the window) and no reuse. Without them a class whose blocks sit
    unresolved for long is scored from its reused blocks alone, which overrates it until its
    forgotten blocks are counted, one ghost length after they leave the cache."""
    reuse_after = [0.0] * (NUM_BUCKETS + 1)  # suffix sums: reuses at bucket >= b
    weighted_after = [0.0] * (NUM_BUCKETS + 1)  # ... weighted by the bucket's age
    survived = [0.0] * (NUM_BUCKETS + 1)  # episodes (reused or forgotten) at bucket >= b
    open_after = [0.0] * (NUM_BUCKETS + 1)  # open episodes at bucket >= b
    open_weighted_after = [0.0] * (NUM_BUCKETS + 1)  # ... weighted by the bucket's age
    for b in range(NUM_BUCKETS - 1, -1, -1):
        reuse_after[b] = reuse_after[b + 1] + reuse[b]
        weighted_after[b] = weighted_after[b + 1] + reuse[b] * _FLOORS[b]
        survived[b] = survived[b + 1] + reuse[b] + end[b]
        if alive is not None:
            open_after[b] = open_after[b + 1] + alive[b]
            open_weighted_after[b] = open_weighted_after[b + 1] + alive[b] * _FLOORS[b]
    scores = [0.0] * NUM_BUCKETS
    for b in range(NUM_BUCKETS):
        stop = ends[b] + 1
        hits = reuse_after[b] - reuse_after[stop]
        wait = weighted_after[b] - weighted_after[stop] - (_FLOORS[b] - 1) * hits
        wait += (survived[b] - hits) * horizon
        inside = open_after[b] - open_after[stop]  # open, still inside the window: waited so far
        wait += open_weighted_after[b] - open_weighted_after[stop] - (_FLOORS[b] - 1) * inside
        wait += open_after[stop] * horizon  # open and past the window: waited all of it
        base = prior[b] if prior is not None else 0.0
        scores[b] = (hits + PRIOR_WEIGHT * base * horizon) / (wait + PRIOR_WEIGHT * horizon)
    return scores
