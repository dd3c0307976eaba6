"""Interleaved timing shared by the benchmarks: the models take turns, so machine noise hits them alike."""

import time

import torch


def timed(fn, device):
    """Wall-clock seconds of one call of `fn`, waiting for the device to finish."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def compare(fns, warmup, repeats, device):
    """{name: [seconds per repeat]} for each function: warm-up first, then the functions interleaved, alternating
    which goes first."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for r in range(repeats):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            times[name].append(timed(fns[name], device))
    return times
