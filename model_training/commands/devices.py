"""The torch device a command is asked to run on, checked before any model or data is loaded.

Shared by the training commands: torch itself reports an unusable device only once something is moved
onto it, as an AssertionError ("Torch not compiled with CUDA enabled") or a RuntimeError ("Expected one
of cpu, cuda, ...") traceback, after the model (and maybe the data) has loaded.
"""

from __future__ import annotations

from model_training.data import DataError

DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(device: str) -> str:
    """`device` ("auto", "cpu", "cuda", "cuda:1", "mps") as a device torch can use here, or a DataError
    naming it; "auto" is CUDA where torch sees it, else the CPU."""
    import torch  # only for the commands that need it: no import-time cost for the others

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise DataError(f"device {device!r} is not a torch device (auto, cpu, cuda, cuda:N, mps)") from None
    if parsed.type not in DEVICE_TYPES:
        raise DataError(f"device {device!r} is not supported here; use one of auto, cpu, cuda, cuda:N, mps")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise DataError(f"device {device!r}: torch sees no CUDA device here (use auto or cpu)")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise DataError(f"device {device!r}: torch sees {count} CUDA device(s), numbered from 0")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise DataError(f"device {device!r}: torch sees no MPS device here (use auto or cpu)")
    return device
