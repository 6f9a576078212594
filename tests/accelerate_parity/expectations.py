"""Which scenarios trainer is expected to match exactly, which fail today, which differ on purpose.

Every registered scenario is compared with Accelerate by ``test_same_as_accelerate.py`` unless
`DIFFERENT` lists it: those are deliberate differences, each pinned by a test in
``test_differences.py`` and listed in docs/migration/accelerate.md. `KNOWN_GAPS` are trainer bugs
and missing names: the comparison runs and is expected to fail (``xfail(strict=True)``), so a
fix shows up as an unexpected pass that must be removed from here.

Keys are ``fnmatch`` patterns over scenario names; values are the process counts they apply to.
"""

from __future__ import annotations

from fnmatch import fnmatch

BOTH = (1, 2)
TWO = (2,)
ONE = (1,)

KNOWN_GAPS: dict[str, tuple[tuple[int, ...], str]] = {}

# Deliberate differences (docs/migration/accelerate.md): not compared one to one;
# test_differences.py pins what each side does.
DIFFERENT: dict[str, tuple[int, ...]] = {
    # The shuffle order without the loader's own generator, on N processes or with
    # use_seedable_sampler but no data_seed, is trainer's own (from a seed save_state keeps).
    "batch_order/shuffle": TWO,
    "batch_order/shuffle_split_batches": TWO,
    "batch_order/seedable_sampler": BOTH,
    "batch_order/seedable_set_epoch_replays": BOTH,
    "train/shuffled": TWO,
    "train/shuffled_dropout_evaluate": TWO,
    "train/seedable_sampler": BOTH,
    "gather_for_metrics/tensor_9_by_2_shuffled": TWO,
    "training_check/plain_shuffle": TWO,
    "training_check/seedable_sampler": BOTH,
    "resume/mid_epoch_seedable": BOTH,
    # trainer's resume replays exactly where Accelerate 1.15's does not.
    "resume/epoch_end": TWO,
    "resume/epoch_end_dropout": TWO,
    "resume/epoch_end_seedable": BOTH,
    "resume/saved_in_the_epochs_last_batch": TWO,
    # dispatch_batches (Accelerate's default for iterable datasets) reads per process.
    "batch_order/dispatch_batches*": TWO,
    "batch_order/iterable*": TWO,
    # Each Accelerator has its own gradient state: a free prepare_data_loader loader has its own.
    "prepare_data_loader/accelerator_sees_the_end": BOTH,
    "gradient_state/break_and_restart": BOTH,
    "batch_order/batch_sampler_as_sampler": ONE,
    "ops/gather_method/scalar": ONE,
    "ops/gather_function/scalar": ONE,
    "ops/reduce_method/min": TWO,
    "ops/reduce_function/min": TWO,
    "ops/reduce_method/sum_scale_2": BOTH,
    "ops/reduce_function/sum_scale_2": BOTH,
    "ops/reduce_*/none": TWO,
    "ops/gather_object/dict": TWO,
    "ops/gather_object/string": TWO,
    # unwrap_model of a compiled model returns the module (keep_torch_compile=False).
    "unwrap/compiled_default": BOTH,
}


def _lookup(table: dict[str, tuple], name: str, world: int, index: int | None) -> object | None:
    for pattern, entry in table.items():
        worlds = entry if index is None else entry[0]
        if fnmatch(name, pattern) and world in worlds:
            return entry if index is None else entry[1]
    return None


def known_gap(name: str, world: int) -> str | None:
    """Why trainer is expected to differ from Accelerate here today, or None."""
    reason = _lookup(KNOWN_GAPS, name, world, 0)
    return reason if isinstance(reason, str) else None


def is_different(name: str, world: int) -> bool:
    """Whether the scenario is a deliberate difference at ``world`` processes."""
    return _lookup(DIFFERENT, name, world, None) is not None
