"""Evaluation of a frozen encoder: task files, MLP heads on its embeddings, baselines and the NMM."""
