"""``python -m pgqueue.bench plain-worker|pgqueuer-worker DSN N``: a benchmark child process."""

import sys

from pgqueue.bench.workers import _child_main

sys.exit(_child_main(sys.argv[1:]))
