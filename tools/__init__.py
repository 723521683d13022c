"""Repository tools outside the library: docs/results.md and the README results block."""
