"""``trainer env``: print the facts a bug report needs, as ``key: value`` lines.

This module owns the ``env`` subcommand and `collect_env`, which other modules and tests
may call. It reports the versions of trainer, Python, the platform, torch and its CUDA build,
the devices (CUDA GPUs, MPS, CPUs, RAM) and the versions of optional packages. Versions come
from the installed distributions' metadata (``importlib.metadata``): no optional package is
imported, so the command stays fast and works even when one of them is broken.

With ``--config_file F`` it also prints the top-level keys of the YAML file ``F``. It does not
validate the file against any schema; that is the job of the command that uses the file.

Examples:
    $ trainer env --config_file ddp.yaml
    trainer_version: 0.1.0
    python_version: 3.11.7
    ...
    jsonargparse: not installed
    config_file: ddp.yaml
      strategy: ddp
      num_processes: 2
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from trainer import __version__
from trainer.errors import ConfigurationError

__all__ = ["OPTIONAL_PACKAGES", "add_parser", "collect_env", "read_config_file", "run"]

NOT_INSTALLED = "not installed"

# Optional packages, keyed by import name, with the distribution names that can provide them
# (tried in order): the import name and the pip name differ for some.
OPTIONAL_PACKAGES: dict[str, tuple[str, ...]] = {
    "torchmetrics": ("torchmetrics",),
    "safetensors": ("safetensors",),
    "rich": ("rich",),
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "deepspeed": ("deepspeed",),
    "torch_xla": ("torch-xla",),
    "megatron.core": ("megatron-core",),
    "jsonargparse": ("jsonargparse",),
}


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add ``trainer env`` to ``subparsers`` and return its parser.

    Examples:
        >>> import argparse
        >>> root = argparse.ArgumentParser(prog="trainer")
        >>> parser = add_parser(root.add_subparsers(dest="command"))
        >>> root.parse_args(["env", "--config_file", "ddp.yaml"]).config_file
        'ddp.yaml'
    """
    parser = subparsers.add_parser(
        "env",
        help="print versions, devices and optional packages (for bug reports)",
        description=(
            "Print the trainer, Python, platform and torch versions, the CUDA/MPS devices, "
            "CPUs, RAM and the versions of optional packages, as 'key: value' lines."
        ),
    )
    parser.add_argument(
        "--config_file",
        metavar="FILE",
        default=None,
        help="a YAML config file whose top-level keys are printed too",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Print `collect_env` and the launch config's top-level keys.

    The config is ``--config_file``, else the default file ``trainer config`` writes (if any).

    The config file is read before anything is printed, so a bad file prints only the error.

    Returns:
        0.

    Raises:
        ConfigurationError: the config file is missing, unreadable, not YAML or not a mapping.
    """
    path = args.config_file
    if path is None:  # the file `trainer config` writes, when there is one
        from trainer.accelerator.launch_config import default_config_path

        default = default_config_path()
        path = str(default) if default.is_file() else None
    config = None if path is None else read_config_file(path)
    for key, value in collect_env().items():
        print(f"{key}: {value}")
    if config is not None:
        print(f"config_file: {path}")
        for key, value in config.items():
            print(f"  {key}: {value}")
    return 0


def collect_env() -> dict[str, str]:
    """Collect the environment facts that ``trainer env`` prints, as strings.

    Returns:
        An ordered mapping with the keys ``trainer_version``, ``python_version``,
        ``platform``, ``torch_version``, ``torch_cuda_version``, ``cuda_available``,
        ``gpu_count``, ``gpu_names``, ``mps_available``, ``cpu_count``, ``total_ram``, then one
        key per entry of `OPTIONAL_PACKAGES` whose value is a version or
        ``"not installed"``.

    Examples:
        On a CPU-only Linux machine with 8 cores and 16 GiB of RAM:

        >>> env = collect_env()
        >>> env["cuda_available"], env["gpu_count"], env["gpu_names"]  # doctest: +SKIP
        ('False', '0', 'none')
        >>> env["cpu_count"], env["total_ram"]  # doctest: +SKIP
        ('8', '16.0 GiB')
    """
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu_names = [torch.cuda.get_device_name(index) for index in range(gpu_count)]
    facts = {
        "trainer_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "torch_cuda_version": str(torch.version.cuda or "none (CPU build)"),
        "cuda_available": str(torch.cuda.is_available()),
        "gpu_count": str(gpu_count),
        "gpu_names": "; ".join(gpu_names) if gpu_names else "none",
        "mps_available": str(torch.backends.mps.is_available()),
        "cpu_count": str(os.cpu_count() or "unknown"),
        "total_ram": _format_bytes(_total_ram_bytes()),
    }
    for module, distributions in OPTIONAL_PACKAGES.items():
        facts[module] = _installed_version(distributions)
    return facts


def read_config_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a YAML file and return its top-level keys with their values as one-line strings.

    Scalars print as Python's ``str``; lists and mappings as compact JSON.

    Args:
        path: the YAML file.

    Returns:
        The top-level keys in file order; an empty file gives ``{}``.

    Raises:
        ConfigurationError: the file is missing or unreadable, is not valid YAML, or its top
            level is not a mapping. The message names the file.

    Examples:
        A file holding ``strategy: ddp`` and ``devices: [0, 1]``:

        >>> read_config_file("ddp.yaml")  # doctest: +SKIP
        {'strategy': 'ddp', 'devices': '[0, 1]'}
    """
    import yaml  # only this branch needs yaml; `import trainer.cli.main` must not load it

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise ConfigurationError(
            f"config file {os.fspath(path)!r} does not exist; pass an existing YAML file to "
            "--config_file"
        ) from err
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigurationError(
            f"config file {os.fspath(path)!r} could not be read ({_one_line(err)}); pass a "
            "readable UTF-8 YAML file to --config_file"
        ) from err
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigurationError(
            f"config file {os.fspath(path)!r} is not valid YAML ({_one_line(err)}); fix the "
            "file or pass another one to --config_file"
        ) from err
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise ConfigurationError(
            f"config file {os.fspath(path)!r} must hold a mapping of keys to values at its top "
            f"level; received {type(content).__name__}. Write it as 'key: value' lines"
        )
    return {str(key): _format_value(value) for key, value in content.items()}


def _installed_version(distributions: tuple[str, ...]) -> str:
    """Version of the first installed distribution; metadata only, so nothing gets imported."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return NOT_INSTALLED


def _total_ram_bytes() -> int | None:
    """Physical memory from /proc/meminfo (Linux), else sysconf, else None (e.g. Windows)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _format_bytes(size: int | None) -> str:
    """``17179869184`` -> ``"16.0 GiB"``; one unit keeps the line easy to compare across reports."""
    if size is None or size <= 0:
        return "unknown"
    return f"{size / 2**30:.1f} GiB"


def _format_value(value: Any) -> str:
    """One line per key: containers as compact JSON (dates and the like via ``str``)."""
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def _one_line(err: BaseException) -> str:
    """YAML and OS errors span several lines; the CLI's error contract is one line."""
    return " ".join(str(err).split())
