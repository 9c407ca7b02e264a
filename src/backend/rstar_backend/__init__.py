"""rstar's PyTorch backend: the Qwen3 model, HF checkpoints, train-step and the embedded engine."""
