"""A claimer process for the multi-process tests: `python -m tests.store.claimer ...`.

Claims batches until the pool is empty and acknowledges each (prints `ACK <ids>` per batch),
or with --die claims one batch, prints `CLAIM <claim_id> <ids>` and exits without acknowledging.
"""

from __future__ import annotations

import argparse
import os
import sys

from dart_ray.store.db import create_engine
from dart_ray.store.log import DurableLog


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dsn")
    p.add_argument("run_id")
    p.add_argument("--n", type=int, default=5)
    p.add_argument("--lease", type=float, default=60.0)
    p.add_argument("--consumer", default=f"proc-{os.getpid()}")
    p.add_argument("--die", action="store_true")
    a = p.parse_args()
    log = DurableLog(create_engine(a.dsn))
    while True:
        claim = log.claim(a.run_id, a.n, consumer=a.consumer, lease_s=a.lease)
        if not claim.rows:
            return
        if a.die:
            print("CLAIM", claim.claim_id, *claim.row_ids, flush=True)
            os._exit(0)  # no ack, no cleanup: the process is gone with its lease
        log.ack(claim)
        print("ACK", *claim.row_ids, flush=True)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
