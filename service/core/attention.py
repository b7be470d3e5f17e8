"""The attention implementations' names, in one torch-free place.

The settings (read without importing torch), `htmllm embed` and the torch runner share these names.
"auto" lets the runner choose for its device (`service.engine.runners.torch.choose_attention`); the
engine takes `None` for it.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Attention = Literal["auto", "sdpa", "eager", "varlen", "flash_attention_2"]
AUTO_ATTENTION: Final = "auto"
ATTENTION_CHOICES: Final[tuple[str, ...]] = get_args(Attention)


def attention_option(choice: str) -> str | None:
    """A choice as the engine takes it: None for "auto"."""
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"attention {choice!r} is not one of {ATTENTION_CHOICES}")
    return None if choice == AUTO_ATTENTION else choice
