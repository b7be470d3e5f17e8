"""What `htmllm serve` checks before it loads a model: that the settings point at a checkpoint and ask
nothing this machine or that checkpoint cannot serve with. Each failure is one typed line and an exit
status (`service.api.main`), said before the seconds of imports and the minutes of a load."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.core.checkpoint_path import CheckpointPathError, check_checkpoint_path
from service.core.errors import ErrorCode, HtmllmError

if TYPE_CHECKING:
    from service.api.settings import Settings


class ModelMissingError(HtmllmError):
    """No checkpoint where the settings point."""

    code = ErrorCode.CHECKPOINT_INVALID


class InvalidSettingsError(HtmllmError):
    """Settings this machine or this checkpoint cannot serve with: exit 2, as the settings the Settings
    class or the engine's configuration refuse, not 1 as a missing or broken model."""

    code = ErrorCode.VALIDATION


def check_model_location(settings: Settings) -> None:
    """Raise ModelMissingError, with what to do about it, when `settings.model_path` is no checkpoint
    directory (missing, a file, no htmllm.json): a look at the path, before anything imports torch
    (`settings.engine_config()` does), so a typo is said at once, not after 4-5 s of imports."""
    from service.api.settings import default_model_path

    path = settings.model_path
    try:
        check_checkpoint_path(path, "--model-path")
    except CheckpointPathError as exc:
        if path.resolve() == default_model_path().resolve():
            raise ModelMissingError(
                f"no model at {path}: the bundled default model has not been built yet: run `make "
                "default-model` (or point HTMLLM_MODEL_PATH / --model-path at a checkpoint directory)"
            ) from None
        # A suggestion names the flag already; otherwise say which settings name the path.
        hint = "" if exc.suggestion else "; point HTMLLM_MODEL_PATH / --model-path at a checkpoint directory"
        raise ModelMissingError(f"{exc}{hint}") from None


def check_model_path(settings: Settings) -> None:
    """Raise, with what to do about it, when `settings.model_path` holds no checkpoint
    (`check_model_location`), its htmllm.json cannot be read, or the settings ask more than it has."""
    check_model_location(settings)
    from service.core.checkpoint import read_meta  # imports torch: only when there is a model to read

    path = settings.model_path
    meta = read_meta(path)  # raises CheckpointError naming the unreadable or invalid file
    if settings.max_length is not None and settings.max_length > meta.max_length:
        raise InvalidSettingsError(
            f"HTMLLM_MAX_LENGTH {settings.max_length} exceeds the {meta.max_length} "
            f"tokens the model at {path} was trained for"
        )


def check_device(settings: Settings) -> None:
    """Raise InvalidSettingsError when this machine cannot run the settings' device and attention
    (`HTMLLM_DEVICE=cuda` without CUDA, `HTMLLM_ATTENTION=flash_attention_2` on CPU): the runner would
    refuse them only once the checkpoint had loaded, as a traceback."""
    from service.engine.loading import check_device as check_engine_device

    try:
        check_engine_device(settings.engine_config())
    except ValueError as exc:
        chosen = f"HTMLLM_DEVICE={settings.device}, HTMLLM_DTYPE={settings.dtype}"
        if settings.backend == "torch":
            chosen += f", HTMLLM_ATTENTION={settings.attention}"
        raise InvalidSettingsError(f"{exc} ({chosen})") from exc
