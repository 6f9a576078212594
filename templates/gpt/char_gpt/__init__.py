"""char-gpt: a small GPT that learns Shakespeare one character at a time.

Modules:
    model: ``GPT`` and its ``TransformerBlock``, plain ``torch.nn``.
    module: ``GPTModule``, the TrainModule (loss, optimizer, sampling).
    datamodule: ``CharDataModule``, the text as (input, next-character) windows.
    config: reads the YAML run config and builds what it names.
    run: what ``python train.py --config configs/default.yaml`` runs.
"""

__version__ = "0.1.0"
