"""Which checkpoint a server runs, for /info and each model route's answer: a name does not say (every
run of `configs/tiny.toml` is "htmllm-tiny", and a retrained or re-headed model keeps its name); the
fingerprint of its files and the id of the training run that made it do.

Each 200 of a model route names the fingerprint in `CHECKPOINT_HEADER`: through a rollout two models
answer behind one Service, and a crawler storing vectors can tell, per answer, which model made them
(polling /info tells only what some pod ran at some moment)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.engine import ModelInfo

CHECKPOINT_HEADER = "x-checkpoint-sha256"


@dataclass(frozen=True)
class CheckpointIdentity:
    """A checkpoint's fingerprint, and its training run's id where htmllm.json records one."""

    sha256: str  # `checkpoint_fingerprint`: what `htmllm embed` pins and an ONNX graph records
    training_run_id: str | None  # htmllm.json's `training.run_id`; None before run ids (the bundled model)

    def header(self) -> dict[str, str]:
        """The header each 200 of a model route carries (`CHECKPOINT_HEADER`)."""
        return {CHECKPOINT_HEADER: self.sha256}


def served_identity(model: ModelInfo, path: Path) -> CheckpointIdentity:
    """The identity of the checkpoint an engine serves: the fingerprint its loading process took of the
    files it loaded (`ModelInfo.checkpoint_sha256`: the inference child's, with
    HTMLLM_INFERENCE_PROCESS), else, for an engine built around a runner by hand, that of the files at
    `path` now. The server had fingerprinted `path` itself, before the child loaded it (or after, for
    `htmllm serve`'s engine): a checkpoint replaced meanwhile was served under the other one's sha."""
    if model.checkpoint_sha256 is None:
        return read_identity(path)
    return CheckpointIdentity(sha256=model.checkpoint_sha256, training_run_id=model.training_run_id)


def read_identity(path: Path) -> CheckpointIdentity:
    """The identity of the checkpoint at `path`: reads its files once (25 ms for the bundled model's
    30 MB), so it is taken at start-up, never per request. Raises CheckpointError as a load would."""
    from service.core.checkpoint import checkpoint_fingerprint, read_meta

    sha256 = checkpoint_fingerprint(path)
    return CheckpointIdentity(sha256=sha256, training_run_id=read_meta(path).training_run_id)
