"""The torch device (and precision) a run is asked for, checked before any model or data is loaded.

One check for every training entry point (the teacher command, `pretrain.train`): torch itself reports
an unusable device only once something is moved onto it, as an AssertionError ("Torch not compiled with
CUDA enabled") or a RuntimeError ("Expected one of cpu, cuda, ...") traceback, after the model (and maybe
the data) has loaded.
"""

from __future__ import annotations

from typing import Final

from model_training.data import DataError

DEVICE_TYPES: Final = ("cpu", "cuda", "mps")


def resolve_device(device: str, *, local_rank: int | None = None, source: str = "") -> str:
    """`device` ("auto", "cpu", "cuda", "cuda:1", "mps") as a device torch can use here, or a DataError
    naming it; "auto" is CUDA where torch sees it, else the CPU.

    `local_rank` (one process per GPU under torchrun) numbers a CUDA device given without an index;
    `source` prefixes the errors with where the device was asked for (e.g. "config: ").
    """
    import torch  # only for the commands that need it: no import-time cost for the others

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise DataError(
            f"{source}device {device!r} is not a torch device (auto, cpu, cuda, cuda:N, mps)"
        ) from None
    if parsed.type not in DEVICE_TYPES:
        raise DataError(
            f"{source}device {device!r} is not supported here; use one of auto, cpu, cuda, cuda:N, mps"
        )
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise DataError(f"{source}device {device!r}: torch sees no CUDA device here (use auto or cpu)")
        count = torch.cuda.device_count()
        if parsed.index is None and local_rank is not None:
            # torchrun shows every rank all the node's GPUs, numbered by local rank; a launcher that shows
            # each rank only its own (one visible device) means that one.
            index = 0 if count == 1 else local_rank
            if index >= count:
                raise DataError(
                    f"{source}device {device!r} for local rank {local_rank} (cuda:{index}): torch sees "
                    f"{count} CUDA device(s), numbered from 0"
                )
            device = f"cuda:{index}"
            parsed = torch.device(device)
        if parsed.index is not None and parsed.index >= count:
            raise DataError(f"{source}device {device!r}: torch sees {count} CUDA device(s), numbered from 0")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise DataError(f"{source}device {device!r}: torch sees no MPS device here (use auto or cpu)")
    return device


def precision_problem(device: str, dtype: str) -> str | None:
    """Why the Engine would refuse to run at `dtype` on `device` (float16 on a CPU), in its own words, or
    None: `EngineConfig`'s rule, asked before any page is pruned. `htmllm eval run` and `htmllm heads
    train` had met it only when the Engine started, once every page was pruned (minutes of work lost)."""
    from service.engine.types import EngineConfig

    try:
        EngineConfig(device=device, dtype=dtype)
    except ValueError as exc:
        return str(exc)
    return None
