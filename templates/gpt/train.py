"""Train char-gpt: ``python train.py [--config FILE] [--trainer.strategy ddp]``.

A thin entry point (the work is in the package's ``run.py``). It must stay a file that runs
as a script: with ``devices`` > 1 the Trainer restarts it under torchrun, and
``trainer launch`` starts it.
"""

import sys

from char_gpt.run import main

if __name__ == "__main__":
    sys.exit(main())
