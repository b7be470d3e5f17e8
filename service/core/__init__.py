"""The shared contract: framework-free pruning, tokenization, modeling and checkpoints."""
