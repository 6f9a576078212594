"""ModelPruning's argument checks (its behaviour is compared with Lightning's in
tests/parity/test_pruning.py)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import prune

import trainer
from tests.conftest import LinearModule, make_loader, quiet_trainer
from trainer.callbacks import ModelPruning


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pruning_fn": "l3_unstructured"}, "pruning_fn='l3_unstructured'"),
        ({"pruning_fn": "ln_structured", "use_global_unstructured": False}, "pruning_dim"),
        (
            {"pruning_fn": "ln_structured", "use_global_unstructured": False, "pruning_dim": 0},
            "pruning_norm",
        ),
        ({"pruning_fn": "random_structured", "pruning_dim": 0}, "not an unstructured method"),
        ({"pruning_fn": prune.L1Unstructured(0.5)}, "the class"),
        ({"pruning_fn": prune.L1Unstructured, "use_global_unstructured": False}, "global"),
        ({"pruning_fn": "l1_unstructured", "parameter_names": ["scale"]}, "parameter_names"),
        ({"pruning_fn": "l1_unstructured", "amount": "half"}, "amount="),
        ({"pruning_fn": "l1_unstructured", "verbose": 3}, "verbose="),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(trainer.ConfigurationError, match=message):
        ModelPruning(**kwargs)


def test_a_parameter_outside_the_model_is_refused_at_setup(tmp_path):
    stranger = torch.nn.Linear(2, 2)
    pruning = ModelPruning("l1_unstructured", parameters_to_prune=[(stranger, "weight")])
    fit = quiet_trainer(tmp_path, max_epochs=1, callbacks=[pruning])
    with pytest.raises(
        trainer.ConfigurationError, match=r"\['Linear.weight'\] are not in the model"
    ):
        fit.fit(LinearModule(), make_loader())


def test_verbose_logs_the_sparsity(tmp_path, caplog):
    pruning = ModelPruning("l1_unstructured", amount=0.5, verbose=2)
    with caplog.at_level("INFO", logger="trainer.callbacks.pruning"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[pruning]).fit(
            LinearModule(), make_loader()
        )
    assert any("-> 2/5 (40.00%)" in record.getMessage() for record in caplog.records)
