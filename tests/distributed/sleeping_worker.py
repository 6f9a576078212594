"""A torchrun worker that records its pid, then never ends: what a hung job looks like."""

import os
import sys
import time
from pathlib import Path

Path(sys.argv[1], f"worker{os.environ['RANK']}.pid").write_text(str(os.getpid()))
while True:
    time.sleep(1)
