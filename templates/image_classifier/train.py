"""Train digits-classifier: ``python train.py [--config FILE] [--trainer.KEY VALUE]``.

A thin entry point (the work is in the package's ``run.py``). Several processes:
``trainer launch --config_file launch_configs/ddp.yaml train.py``.
"""

import sys

from digits_classifier.run import main

if __name__ == "__main__":
    sys.exit(main())
