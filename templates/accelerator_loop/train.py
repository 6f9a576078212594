"""Train digits-loop: ``python train.py [--config FILE] [--training.KEY VALUE]``.

A thin entry point (the loop is the package's ``loop.py``). Several processes:
``trainer launch --config_file launch_configs/ddp_cpu.yaml train.py``.
"""

import sys

from digits_loop.run import main

if __name__ == "__main__":
    sys.exit(main())
