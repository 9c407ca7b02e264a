"""rstar's PyTorch backend: the model (Qwen3, Qwen2/2.5, Llama 3.x), HF checkpoints, train-step and the embedded engine."""
