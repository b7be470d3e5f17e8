"""The MiniLM baseline as `htmllm eval run` loads it."""

from __future__ import annotations

import numpy as np
import pytest

from model_training.evaluation.baselines import minilm_embeddings


def test_loading_minilm_writes_no_bar_to_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' "Loading weights" bar was carriage-return redraws in `make default-model`'s log."""
    vectors = minilm_embeddings(["Weather in Prague: rain today.", "Cheap laptops in our shop."])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    err = capsys.readouterr().err
    assert "\r" not in err and "Loading weights" not in err
