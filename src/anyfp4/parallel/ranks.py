"""Tensor-parallel ranks as processes: one per GPU (NCCL) or CPU ranks (gloo) on this host, started and
stopped by the calling process, rank 0's result handed back to it."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def check_rank_devices(tp: int, device_type: str) -> None:
    """A ValueError when ``tp`` GPU ranks would need more GPUs than this machine has."""
    if device_type == "cuda" and torch.cuda.device_count() < tp:
        raise ValueError(f"--tp {tp} needs {tp} GPUs, this machine has {torch.cuda.device_count()}")


def init_process_group(rank: int, tp: int, device_type: str, port: int) -> None:
    import threading

    from tqdm import tqdm

    # tqdm's default lock is a multiprocessing semaphore, which a rank leaving through os._exit (run_rank)
    # never releases: the resource tracker then warns about leaked semaphores when the run ends.
    tqdm.set_lock(threading.RLock())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "gloo" and os.path.exists("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # CPU ranks are local: talk over loopback
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=tp, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group(backend, rank=rank, world_size=tp)


def run_rank(work, *args) -> None:
    """Run one rank's ``work(*args)`` inside an initialised process group. On an error the traceback is
    printed and the process leaves at once: tearing NCCL down with collectives still pending on the other
    ranks would hang, and the parent's ``mp.spawn`` then stops the other ranks and reports the failure."""
    import sys
    import traceback

    try:
        model = work(*args)
        dist.barrier()  # no rank tears its connections down while another still uses them
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    if model is not None and model.device.type == "cuda":
        from ..runtime.generate import forget_decode_graphs

        forget_decode_graphs(model)  # graphs holding NCCL kernels go before the communicator
        torch.cuda.synchronize()
    del model
    dist.destroy_process_group()
    # The rank's work is done and written: leave without the interpreter's teardown, where a communication
    # helper thread once aborted a finished CPU rank ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(worker, args: tuple, tp: int) -> None:
    """Run ``worker(rank, *args)`` in ``tp`` processes and wait for them.

    Interrupts belong to this process: a Ctrl-C reaches the whole process group, so the ranks start with
    SIGINT ignored (inherited, in effect before their interpreter starts) and this process, stopped by the
    interrupt or by SIGTERM, terminates them. No rank outlives it and none prints a traceback of its own."""
    import signal
    import threading

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    in_main_thread = threading.current_thread() is threading.main_thread()  # where signal handlers are set
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
    try:
        ranks = mp.spawn(worker, args=args, nprocs=tp, join=False)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
    try:
        while not ranks.join():
            pass
    except ProcessException as e:
        raise RuntimeError(f"tensor-parallel {e} (its error is printed above)") from e
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.terminate()
        for process in ranks.processes:
            process.join()


def rank_device(device_type: str, rank: int) -> torch.device:
    """The device of ``rank``: GPU ``rank``, or the CPU."""
    return torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")


def run_on_ranks(work, args: tuple, tp: int, device_type: str, port: int):
    """``work(rank, tp, device, *args)`` on ``tp`` ranks in one process group (``spawn_ranks``); each returns
    ``(model, result)`` — the model it built (None for none), torn down with the group — and rank 0's result
    comes back (a value ``torch.save`` writes: numbers, strings, lists, dicts, tensors). ``work`` must be a
    module-level function (the ranks are new processes)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "result.pt")
        spawn_ranks(_rank_main, (work, args, tp, device_type, port, result_file), tp)
        return torch.load(result_file, weights_only=True)


def _rank_main(rank: int, work, args: tuple, tp: int, device_type: str, port: int, result_file: str) -> None:
    init_process_group(rank, tp, device_type, port)

    def rank_work():
        model, result = work(rank, tp, rank_device(device_type, rank), *args)
        if rank == 0:
            torch.save(result, result_file)
        return model

    run_rank(rank_work)
