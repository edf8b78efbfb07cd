#!/usr/bin/env python3
"""All-reduce bus bandwidth through PyTorch's torch.distributed (NCCL backend), one process per GPU.

The figure that hotops' allreduce/cuda/<dtype>/fwd/bytes:B/gpus:G/inplace:1 entries are held against
on the same machine: torch.distributed.all_reduce (sum, in place) of B bytes over G GPUs, timed with
CUDA events over back-to-back calls after a warm-up, each sample's time the slowest rank's, busbw as
nccl-tests defines it (algbw = B / time, busbw = algbw x 2(G-1)/G).

    python3 tools/nccl_torch_baseline.py --gpus 4                   # 256 MiB and 1 GiB, f32
    python3 tools/nccl_torch_baseline.py --gpus 2 --dtype bf16 --sizes 1048576,268435456

The spawned processes inherit this process's environment (NCCL_* settings included).
"""
import argparse
import os
import socket
import statistics


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port, results):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    try:  # device_id binds the communicator to this GPU eagerly (torch 2.3 and later)
        dist.init_process_group("nccl", rank=rank, world_size=args.gpus, device_id=torch.device("cuda", rank))
    except TypeError:
        dist.init_process_group("nccl", rank=rank, world_size=args.gpus)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    out = []
    for size in args.sizes:
        x = torch.zeros(size // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device="cuda")
        for _ in range(args.warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(args.samples):
            dist.barrier()
            torch.cuda.synchronize()
            start.record()
            for _ in range(args.iters):
                dist.all_reduce(x)
            stop.record()
            stop.synchronize()
            t = torch.tensor([start.elapsed_time(stop) / 1e3 / args.iters], dtype=torch.float64, device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time
            samples.append(t.item())
        out.append((size, statistics.median(samples)))
        del x
        torch.cuda.empty_cache()
    if rank == 0:
        results.extend(out)
    dist.destroy_process_group()


def main():
    import torch
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=torch.cuda.device_count(), help="GPUs, one process each (default: all)")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--sizes", default="268435456,1073741824", help="bytes, comma-separated (default 256 MiB and 1 GiB)")
    p.add_argument("--iters", type=int, default=20, help="all-reduces per timed sample")
    p.add_argument("--samples", type=int, default=5, help="timed samples per size (the median is reported)")
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.gpus < 2 or args.gpus > torch.cuda.device_count():
        p.error(f"--gpus {args.gpus}: needs 2 to {torch.cuda.device_count()} (the GPUs this machine has)")
    with mp.Manager() as manager:
        results = manager.list()
        mp.spawn(worker, args=(args, free_port(), results), nprocs=args.gpus, join=True)
        factor = 2 * (args.gpus - 1) / args.gpus
        print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{args.gpus} x {torch.cuda.get_device_name(0)}, {args.dtype}, all_reduce in place")
        print(f"{'bytes':>12} {'time_us':>10} {'algbw_GBps':>11} {'busbw_GBps':>11}   hotops entry")
        for size, seconds in results:
            algbw = size / seconds / 1e9
            print(f"{size:>12} {seconds * 1e6:>10.1f} {algbw:>11.1f} {algbw * factor:>11.1f}   "
                  f"allreduce/cuda/{args.dtype}/fwd/bytes:{size}/gpus:{args.gpus}/inplace:1")


if __name__ == "__main__":
    main()
