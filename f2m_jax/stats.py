"""The statistics of the results: a session's accuracy keys and the intervals of means over seeds. The standard
library and scipy only (no JAX), so that the report reads results without starting JAX."""
from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

KEYS = ('acc', 'acc_base', 'acc_novel', 'hm')  # a session's statistics, in the tables' order


def t_interval(values: Sequence[float]) -> Optional[float]:
  """Half-width of the 95% interval of a mean over few values: t(0.975, n-1) * std(ddof=1) / sqrt(n)."""
  if len(values) < 2:
    return None
  from scipy.stats import t  # pylint: disable=g-import-not-at-top
  return float(t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)))
