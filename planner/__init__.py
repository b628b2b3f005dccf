"""splitroom's pure core: deal, scheduler, metrics (no IO, no clock)."""

import planner.optimal  # noqa: F401  registers split: optimal with planner.deal.SPLITS
