"""digits-loop: your own training loop, on any device with ``Accelerator``.

Modules:
    model: the network (``build_model``), plain ``torch.nn``.
    data: the digits split and plain ``DataLoader`` objects.
    config: the YAML run config as dataclasses, with overrides.
    loop: the loop itself (``train``): what you edit.
    run: what ``python train.py`` runs.
"""

__version__ = "0.1.0"
