"""digits-classifier: a CNN that learns handwritten digits with ``trainer``.

Modules:
    model: the network (``build_model``), plain ``torch.nn``.
    module: ``DigitsClassifier``, the TrainModule (steps, metrics, optimizer).
    data: ``DigitsDataModule``, the train/val/test split and its loaders.
    config: reads the YAML run config and builds what it names.
    run: what ``python train.py --config configs/default.yaml`` runs.
"""

__version__ = "0.1.0"
