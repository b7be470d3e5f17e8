"""The ONNX graph's quantisation choices, in one torch-free place.

The settings (read without importing torch), both command lines and the export share these names:
"none" is the float32 graph, and every other choice names a quantised graph that is stored next to it
in the checkpoint directory. The export and the engine take `None` for "none".
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Quantization = Literal["none", "int8"]
NO_QUANTIZATION: Final = "none"
QUANTIZATION_CHOICES: Final[tuple[str, ...]] = get_args(Quantization)
# quantisation -> its graph's file name in a checkpoint (the float32 graph is onnx_export.ONNX_FILE)
QUANTIZED_ONNX_FILES: Final[dict[str, str]] = {"int8": "model.int8.onnx"}


def quantization_option(choice: str) -> str | None:
    """A choice as the export and the engine take it: None for the float32 graph."""
    if choice not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization {choice!r} is not one of {QUANTIZATION_CHOICES}")
    return None if choice == NO_QUANTIZATION else choice
