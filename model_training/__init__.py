"""Training stack: tokenizer, data, teachers, objectives, pretraining, evaluation, export."""
