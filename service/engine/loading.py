"""Loading a checkpoint into a runner, and checking first that this machine can run the configuration.

Apart from the Engine because two other places load without one: the inference child process builds its
runner here (`runners.process`), and `htmllm serve` / `htmllm embed` check the device before anything
loads.
"""

from __future__ import annotations

from pathlib import Path

from service.core.checkpoint import (
    TOKENIZER_FILE,
    CheckpointError,
    CheckpointMeta,
    checkpoint_fingerprint,
    load_checkpoint,
    read_meta,
    require_file,
)
from service.core.tokenizer import HtmlTokenizer, TokenizerError
from service.engine.runners import Runner
from service.engine.types import EngineConfig


def _meta_and_tokenizer(path: Path) -> tuple[CheckpointMeta, HtmlTokenizer]:
    """The checkpoint's metadata and tokenizer, checked against each other, without its weights."""
    meta = read_meta(path)
    require_file(path / TOKENIZER_FILE)  # unreadable: said as load_checkpoint says it
    try:
        tokenizer = HtmlTokenizer.from_file(path / TOKENIZER_FILE)
    except TokenizerError as exc:  # the checkpoint is what is wrong, as load_checkpoint reports it
        raise CheckpointError(f"checkpoint {path}: {exc}") from exc
    if tokenizer.sha256 != meta.tokenizer_sha256:
        raise CheckpointError(f"vocab mismatch: {path / TOKENIZER_FILE} is not the tokenizer the model used")
    return meta, tokenizer


def build_runner(
    path: Path, config: EngineConfig, *, encoder_only: bool = False
) -> tuple[Runner, CheckpointMeta, HtmlTokenizer]:
    """Load the checkpoint and wrap it in the configured backend's runner (in a child process when
    `config.inference_process`: this process then holds only the metadata and the tokenizer).

    `encoder_only`: without the task heads, unread (the torch backend in process only): what the
    evaluation embeds pages with, where a head that does not load (the one `heads train` retrains under
    its name) must not stop it."""
    if encoder_only and (config.inference_process or config.backend != "torch"):
        raise ValueError("encoder_only loads the torch backend in this process")
    if config.inference_process:
        from service.engine.runners.process import ProcessRunner

        meta, tokenizer = _meta_and_tokenizer(path)
        # The metadata the child loaded, not `meta`: the files may have been replaced in between. The
        # runner refuses a child whose heads, tokenizer or width differ from `meta` (what `tokenizer`
        # was checked against); the rest (name, prune version, max length) is the child's to say.
        process_runner = ProcessRunner(path, config, expected=meta)
        return process_runner, process_runner.meta, tokenizer
    if config.backend == "onnx":
        from service.engine.onnx_export import ensure_onnx
        from service.engine.runners.onnx import ExpectedGraph, OnnxRunner

        meta, tokenizer = _meta_and_tokenizer(path)
        # The checkpoint whose metadata was just read: the graph loaded must be its own, of the
        # quantisation asked for, whatever was written to the file since `ensure_onnx` looked at it.
        expect = ExpectedGraph(config.onnx_quantize, checkpoint_fingerprint(path))
        graph = ensure_onnx(
            path, config.onnx_path, quantize=config.onnx_quantize, fingerprint=expect.fingerprint
        )
        onnx_runner = OnnxRunner(
            graph,
            pad_id=tokenizer.special_ids.pad,
            head_names=[spec.name for spec in meta.heads],
            device=config.device,
            intra_op_threads=config.intra_op_threads,
            expect=expect,
        )
        return onnx_runner, meta, tokenizer
    from service.engine.runners.torch import TorchRunner

    heads = [spec.name for spec in read_meta(path).heads] if encoder_only else []
    checkpoint = load_checkpoint(path, without_heads=heads)
    torch_runner = TorchRunner(
        checkpoint.model,
        device=config.device,
        dtype=config.dtype,
        attn_implementation=config.attn_implementation,
        intra_op_threads=config.intra_op_threads,
    )
    return torch_runner, checkpoint.meta, checkpoint.tokenizer


def check_device(config: EngineConfig) -> None:
    """ValueError when `config` asks for what this machine cannot run: CUDA where torch (or, for the onnx
    backend, onnxruntime) finds none, or an attention kernel its device and dtype cannot take
    (flash_attention_2 on CPU).

    The runner refuses them too, but only once the checkpoint has loaded (or in the inference child, or,
    for onnx, after a whole ONNX export); a caller that checks first (`htmllm serve`, `htmllm embed`)
    says so in one line, before anything loads.
    """
    if config.backend == "onnx":
        if config.device == "cuda":  # onnxruntime is imported only for what needs it, as torch below
            import onnxruntime

            available = onnxruntime.get_available_providers()
            if "CUDAExecutionProvider" not in available:
                raise ValueError(
                    "device 'cuda', but onnxruntime has no CUDAExecutionProvider here (install "
                    f"onnxruntime-gpu for CUDA); available: {available}"
                )
        return
    if config.backend != "torch":
        return
    if config.device == "cuda":  # torch is imported only for what needs it: the default asks nothing
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device 'cuda', but this machine has no usable CUDA device")
    if config.attn_implementation is not None:
        from service.engine.runners.torch import choose_attention

        choose_attention(config.device, config.dtype, config.attn_implementation)
