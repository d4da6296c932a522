#!/usr/bin/env python
"""The fetch phase of a conversion alone: read every byte range a bf16 export reads, as the converter's
reader does (the chunks and the chunks in flight of `ConversionPlan.chunk_limit` and `.depth`, each chunk
split into parts across the store's requests in flight), into reused buffers, and nothing else: no cast, no write.

Started by `tests/benchmarks/scaleout.py --sweep ... --fetch-only` against a throttled store, so the sweep
can tell the transport's scaling from the converter's CPU. Prints one JSON line: the bytes read, the seconds
of the fetch phase (the scan before it not counted) and the scan's seconds.

    AWS_ENDPOINT_URL=http://127.0.0.1:PORT python tests/benchmarks/fetch_plan.py s3://bench/ckpt
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from inspector.convert.options import CHUNK_ELEMS  # noqa: E402
from inspector.convert.plan import PIPELINE_DEPTH, REMOTE_DEPTH, REMOTE_SPLIT  # noqa: E402
from inspector.convert.reader import FilePool, buffer, iter_chunks, read_segments_into  # noqa: E402
from inspector.format.dtypes import itemsize  # noqa: E402
from inspector.remote.roots import source_at  # noqa: E402
from inspector.scan.model import Kind  # noqa: E402
from inspector.scan.scanner import scan  # noqa: E402
from inspector.system.bytesource import is_url  # noqa: E402


def main() -> None:
    url = sys.argv[1]
    t0 = time.monotonic()
    ckpt = scan(url)
    scanned = time.monotonic() - t0
    tensors = [t for t in ckpt.tensors if t.kind is not Kind.TIED]  # an alias reads nothing of its own
    remote = is_url(url)  # as ConversionPlan.depth and .chunk_limit decide
    depth = REMOTE_DEPTH if remote else PIPELINE_DEPTH
    chunk = CHUNK_ELEMS // (REMOTE_SPLIT if remote else 1)
    largest = max(itemsize(s.dtype) for t in tensors for s in t.segments)
    bufs = [buffer(chunk * largest) for _ in range(depth)]
    pending: deque[Future[int]] = deque()
    total = 0
    with FilePool(source_at(ckpt.root)) as pool, ThreadPoolExecutor(depth) as ahead:
        start = time.monotonic()
        turn = 0
        for t in tensors:
            for segs in iter_chunks(t.segments, chunk):
                if len(pending) == depth:  # the oldest chunk's buffer is the next one to fill
                    total += pending.popleft().result()
                pending.append(ahead.submit(read_segments_into, pool, segs, bufs[turn % depth]))
                turn += 1
        while pending:
            total += pending.popleft().result()
        seconds = time.monotonic() - start
    print(json.dumps({"bytes": total, "seconds": seconds, "scan_seconds": scanned}))


if __name__ == "__main__":
    main()
