"""Decoding: the static decode spec, the state, the step, the loops and their entry points."""
