"""Models: the Flax decoder and its KV cache, sampling (the one warp), device meshes."""
