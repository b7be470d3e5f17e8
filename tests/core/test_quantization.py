"""The ONNX quantisation choices shared by the settings, the command lines and the export."""

from __future__ import annotations

import pytest

from service.core.quantization import (
    NO_QUANTIZATION,
    QUANTIZATION_CHOICES,
    QUANTIZED_ONNX_FILES,
    quantization_option,
)


def test_every_choice_but_none_names_a_graph_file() -> None:
    assert QUANTIZATION_CHOICES[0] == NO_QUANTIZATION
    assert set(QUANTIZATION_CHOICES) - {NO_QUANTIZATION} == set(QUANTIZED_ONNX_FILES)
    assert len(set(QUANTIZED_ONNX_FILES.values())) == len(QUANTIZED_ONNX_FILES)
    assert all(name.endswith(".onnx") and name != "model.onnx" for name in QUANTIZED_ONNX_FILES.values())


def test_options_map_none_to_the_float32_graph() -> None:
    assert quantization_option(NO_QUANTIZATION) is None
    assert quantization_option("int8") == "int8"
    with pytest.raises(ValueError, match="int4"):
        quantization_option("int4")
