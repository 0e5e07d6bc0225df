"""Collectives for threads that stand in for training processes, shared by the vLLM server tests."""

import threading


class ThreadCollectives:
    """`Collective`s for N threads in one process (gather_object / broadcast_object through a barrier), standing in
    for N training processes."""

    def __init__(self, n: int):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=120)
        self.slots = [None] * n

    def abort(self):
        self.barrier.abort()

    def __getitem__(self, rank):
        outer = self

        class _Collective:
            process_index = rank
            num_processes = outer.n

            def gather_object(self, items):
                outer.slots[rank] = list(items)
                outer.barrier.wait()
                out = [x for slot in outer.slots for x in slot]
                outer.barrier.wait()
                return out

            def broadcast_object(self, obj):
                if rank == 0:
                    outer.slots[0] = obj
                outer.barrier.wait()
                out = outer.slots[0]
                outer.barrier.wait()
                return out

        return _Collective()
