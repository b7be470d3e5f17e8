"""`htmllm export-onnx --checkpoint DIR --out model.onnx`: one graph with the embedding and every head."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from service.core.quantization import NO_QUANTIZATION, QUANTIZATION_CHOICES, quantization_option


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "export-onnx",
        help="export a checkpoint to ONNX (dynamic batch and length; embedding and head outputs)",
    )
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint directory to export")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the graph (default: model.onnx inside the checkpoint, where the service looks)",
    )
    parser.add_argument(
        "--opset", type=int, default=None, help="ONNX opset version (default 23: fused Attention and RoPE)"
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZATION_CHOICES,
        default=NO_QUANTIZATION,
        help="int8: dynamic int8 weights for CPUs with VNNI/AMX (default out: model.int8.onnx)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.core.checkpoint import load_checkpoint
    from service.core.errors import HtmllmError
    from service.engine.onnx_export import OPSET, default_onnx_path, export_onnx

    quantize = quantization_option(args.quantize)
    out = args.out if args.out is not None else default_onnx_path(args.checkpoint, quantize)
    started = time.perf_counter()
    try:
        path = export_onnx(
            load_checkpoint(args.checkpoint), out, opset=args.opset or OPSET, quantize=quantize
        )
    except HtmllmError as exc:
        print(f"htmllm export-onnx: {exc.code}: {exc}", file=sys.stderr)
        return 1
    size_mb = path.stat().st_size / 1e6
    print(f"wrote {path} ({size_mb:.1f} MB) in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return 0
