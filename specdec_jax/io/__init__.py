"""Readers and writers for model checkpoints: GGUF and Hugging Face safetensors."""
