"""gamma 'auto': the per-step policy and cost table, its measurement, and the offline replay."""
