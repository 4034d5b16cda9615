"""Forward+backward time of MultigridBatchNorm relative to nn.BatchNorm3d.

Target (DESIGN.md, section 5): within 1.15x. The variants are measured side by side in one run,
interleaved repetition by repetition (so drifting machine load hits all of them alike), and the
medians compared.

Usage::

    python benchmarks/norm.py                       # (64, 64, 8, 56, 56) on CPU (and CUDA)
    python benchmarks/norm.py --shape 16 64 8 56 56 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from lightning_multigrid.norm import MultigridBatchNorm


def _timed_step(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor, device: torch.device) -> float:
    """Seconds for one training forward + backward of ``layer`` on ``x``."""
    x.grad = None
    layer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    layer(x).backward(grad)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run(shape: tuple[int, ...], device: torch.device, repeats: int, warmup: int) -> None:
    channels = shape[1]
    x = torch.randn(shape, device=device, requires_grad=True)
    grad = torch.randn(shape, device=device)
    variants: dict[str, Callable[[], nn.Module]] = {
        "nn.BatchNorm3d": lambda: nn.BatchNorm3d(channels),
        "MultigridBatchNorm k=1": lambda: MultigridBatchNorm(channels, num_splits=1),
        "MultigridBatchNorm k=4": lambda: MultigridBatchNorm(channels, num_splits=4),
        "MultigridBatchNorm k=8": lambda: MultigridBatchNorm(channels, num_splits=8),
    }
    layers = {name: make().to(device).train() for name, make in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in layers}
    for repeat in range(warmup + repeats):
        # Rotate the order so no variant always runs right after the same neighbour.
        names = list(layers)
        names = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in names:
            seconds = _timed_step(layers[name], x, grad, device)
            if repeat >= warmup:
                times[name].append(seconds)
    baseline = statistics.median(times["nn.BatchNorm3d"])
    threads = torch.get_num_threads() if device.type == "cpu" else None
    where = f"{device.type}" + (f", {threads} threads" if threads else f", {torch.cuda.get_device_name(device)}")
    print(f"input {tuple(shape)} float32 on {where}; median of {repeats} forward+backward steps")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:<24} {median * 1e3:9.1f} ms   {median / baseline:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[64, 64, 8, 56, 56], help="(N, C, T, H, W)")
    parser.add_argument("--repeats", type=int, default=7, help="measured steps per variant (7)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps per variant (2)")
    parser.add_argument("--cpu-only", action="store_true", help="skip CUDA even if available")
    args = parser.parse_args()
    if len(args.shape) != 5:
        parser.error(f"--shape needs 5 numbers (N, C, T, H, W), got {args.shape}")
    devices = [torch.device("cpu")]
    if torch.cuda.is_available() and not args.cpu_only:
        devices.append(torch.device("cuda"))
    for device in devices:
        run(tuple(args.shape), device, args.repeats, args.warmup)


if __name__ == "__main__":
    main()
