"""The freeing pattern of a trainer's ZeroMQ I/O thread, as script text for a fresh process:
four 19 MB messages held at once (a prefetch), written, freed; three times, each round's page
faults of that thread appended to ``faults`` (shared by the heap tests, unit and integration).
"""

RECEIVING_THREAD = """
import resource, threading
import numpy as np

faults = []


def receive():
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        held = []
        for _ in range(4):
            a = np.empty(19 * 2**20, np.uint8)
            a.fill(1)
            held.append(a)
        del held, a
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)


t = threading.Thread(target=receive)
t.start()
t.join()
"""
