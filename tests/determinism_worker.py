"""A fresh process for the determinism properties: digests of cases computed here, printed as JSON.

    python tests/determinism_worker.py digests CASES.json
        every promised (backend, level) of every case: first on the main thread, then on one other thread,
        then on 4 threads at once. With XCONV_TEST_TORCH_FIRST=1, torch is imported (before numpy) and runs a
        threaded convolution first, so xconv's workers run on torch's OpenMP threads; XCONV_TEST_AFFINITY=0
        pins the process to CPU 0 first (BLAS and xconv then see one CPU).
    python tests/determinism_worker.py fork CASES.json (torch|xconv) TIMEOUT
        the parent runs torch's OpenMP work ("torch": xconv is imported, never called) or that and every case on
        xconv ("xconv"), then forks; the child computes the digests on its main thread and on threads and sends
        them back through a pipe. A child still running after TIMEOUT seconds is killed and reported as hung.

Output (stdout, one JSON object): {"main": {key: digests}, "thread": ..., "concurrent": [...], "hung": bool}.
The environment (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, ...) is the parent test's choice.
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def torch_work():
    import torch
    x = torch.randn(8, 32, 64, 64)
    w = torch.randn(32, 32, 3, 3)
    for _ in range(3):
        torch.nn.functional.conv2d(x, w, padding=1).sum()
    torch.randn(512, 512) @ torch.randn(512, 512)


def all_digests(cases):
    from determinism_cases import PROMISED, digests, on_threads

    def run():
        return {f"{i}|{b}|{d}": digests(c, b, d) for i, c in enumerate(cases) for b, d in PROMISED}

    main = run()
    thread = on_threads(run, 1)[0]
    concurrent = on_threads(run, 4)
    return dict(main=main, thread=thread, concurrent=concurrent)


def main(argv):
    mode, path = argv[0], argv[1]
    if os.environ.get("XCONV_TEST_AFFINITY") and hasattr(os, "sched_setaffinity"):
        cpus = {int(c) for c in os.environ["XCONV_TEST_AFFINITY"].split(",")} & os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus or os.sched_getaffinity(0))   # before numpy: BLAS sizes its pool from it
    if os.environ.get("XCONV_TEST_TORCH_FIRST") == "1" or mode == "fork":
        torch_work()                                   # torch (and its libgomp) before numpy is imported here
    from determinism_cases import load_cases
    with open(path) as f:
        cases = load_cases(f.read())
    if mode == "digests":
        print(json.dumps(dict(all_digests(cases), hung=False)))
        return 0
    kind, timeout = argv[2], float(argv[3])
    import xconv  # noqa: F401  (imported in the parent either way; called only for kind == "xconv")
    parent = all_digests(cases)["main"] if kind == "xconv" else None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # the child
        os.close(r)
        try:
            out = json.dumps(all_digests(cases)).encode()
            with os.fdopen(w, "wb") as f:
                f.write(out)
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout
    chunks = []
    os.set_blocking(r, False)
    while True:
        try:
            data = os.read(r, 1 << 16)
        except BlockingIOError:
            data = None
        if data:
            chunks.append(data)
        elif data == b"":
            break
        elif time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print(json.dumps(dict(hung=True, parent=parent)))
            return 0
        else:
            time.sleep(0.05)
    os.waitpid(pid, 0)
    child = json.loads(b"".join(chunks).decode() or "{}")
    print(json.dumps(dict(child, hung=False, parent=parent)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
