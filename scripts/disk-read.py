#!/usr/bin/env python3
"""Sequential read bandwidth of a file with O_DIRECT: 1 MiB reads, DEPTH (4) in flight from as
many threads (each takes the next MiB in turn), as `fio --rw=read --bs=1M --direct=1
--iodepth=4` measures it. For the bench scripts on a machine without fio. Prints MB/s.
    disk-read.py FILE [DEPTH]
"""
import mmap
import os
import sys
import threading
import time

BLOCK = 1 << 20


def main():
    path = sys.argv[1]
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    size = os.path.getsize(path) // BLOCK * BLOCK
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    lock = threading.Lock()
    state = {"next": 0, "read": 0, "error": None}

    def reader():
        buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
        while True:
            with lock:
                at = state["next"]
                if at >= size or state["error"]:
                    return
                state["next"] = at + BLOCK
            try:
                got = os.preadv(fd, [buf], at)
            except OSError as error:
                with lock:
                    state["error"] = error
                return
            with lock:
                state["read"] += got

    threads = [threading.Thread(target=reader) for _ in range(depth)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    os.close(fd)
    if state["error"]:
        sys.exit(f"disk-read: {path}: {state['error']}")
    print(round(state["read"] / elapsed / 1e6))


if __name__ == "__main__":
    main()
