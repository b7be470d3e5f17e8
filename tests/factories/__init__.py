"""In-process builders of tiny tokenizers, models and checkpoints for hermetic tests."""
