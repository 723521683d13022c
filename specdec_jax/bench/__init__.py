"""Studies: benchmark runs, the reproducible sweep, prompt sets and the timing harness."""
