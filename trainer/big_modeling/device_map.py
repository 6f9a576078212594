"""Device-map arithmetic behind ``infer_auto_device_map``: sizes, tied weights, the greedy fill.

Owns: the byte size of every module (parameters and buffers, a tied weight counted once), the
largest layer, parsing and ordering ``max_memory``, the fill of devices in order, the clean-up
of the resulting map and the lookup of a tensor's device in a map. Does not own moving or
loading tensors (``trainer.big_modeling.offload``) nor the public API (``trainer.big_modeling``).
"""

from __future__ import annotations

import math
import re
import warnings
from collections import defaultdict
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Union

import torch

from trainer.errors import ConfigurationError, describe

__all__ = [
    "DeviceKey",
    "DeviceMap",
    "balanced_memory",
    "check_device_map",
    "class_names",
    "clean_device_map",
    "compute_module_sizes",
    "fill_devices",
    "find_tied_parameters",
    "largest_layer",
    "lookup_device",
    "main_device",
    "normalize_device_map",
    "parse_max_memory",
    "resolve_dtype",
    "torch_device",
]

DeviceKey = Union[int, str]  # noqa: UP007  # a GPU index, "cpu", "disk", "mps", "xpu:1", ...
DeviceMap = dict[str, DeviceKey]
_Item = tuple[str, Union[torch.nn.Module, torch.Tensor]]  # noqa: UP007  # (name, module or tensor)

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
_HOST = ("cpu", "disk")


def resolve_dtype(dtype: torch.dtype | str | None, argument: str = "dtype") -> torch.dtype | None:
    """``torch.float16``, ``"float16"`` or ``"torch.float16"`` as a dtype (None stays None)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ConfigurationError(
            f"{argument}={describe(dtype)} is not a torch dtype; pass e.g. torch.bfloat16 or 'bfloat16'."
        )
    return resolved


def tensor_bytes(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """Bytes of ``tensor`` once floating-point values are cast to ``dtype`` (ints never are)."""
    itemsize = dtype.itemsize if dtype is not None and tensor.is_floating_point() else None
    return tensor.numel() * (itemsize or tensor.element_size())


def named_tensors(module: torch.nn.Module, *, recurse: bool = True) -> Iterator[_Item]:
    """Parameters (a tied one once, under its first name), then buffers."""
    yield from module.named_parameters(recurse=recurse)
    yield from module.named_buffers(recurse=recurse)


def compute_module_sizes(
    model: torch.nn.Module,
    dtype: torch.dtype | None = None,
    special_dtypes: dict[str, torch.dtype] | None = None,
) -> dict[str, int]:
    """Bytes of every module and tensor name (and ``""`` for the model), buffers included.

    Examples:
        >>> sizes = compute_module_sizes(torch.nn.Sequential(torch.nn.Linear(100, 100)))
        >>> sizes[""], sizes["0"], sizes["0.bias"]
        (40400, 40400, 400)
    """
    sizes: dict[str, int] = defaultdict(int)
    for name, tensor in named_tensors(model):
        special = (special_dtypes or {}).get(name)
        size = tensor_bytes(tensor, special or dtype)
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            sizes[".".join(parts[:depth])] += size
    return sizes


def find_tied_parameters(model: torch.nn.Module) -> list[list[str]]:
    """Groups of parameter names that are one Parameter object (tied weights), sorted.

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
        >>> net[1].weight = net[0].weight
        >>> find_tied_parameters(net)
        [['0.weight', '1.weight']]
    """
    names: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names[id(param)].append(name)
    return sorted(sorted(group) for group in names.values() if len(group) > 1)


def largest_layer(
    items: list[_Item], sizes: dict[str, int], no_split: list[str]
) -> tuple[int, list[str]]:
    """Size and names of the biggest unsplittable unit: a leaf, a no-split module or a tensor."""
    best, names = 0, []
    todo = list(items)
    while todo:
        name, item = todo.pop(0)
        children = list(item.named_children()) if isinstance(item, torch.nn.Module) else []
        if children and type(item).__name__ not in no_split:
            todo = [(f"{name}.{child}", module) for child, module in children] + todo
            continue
        if sizes[name] > best:
            best, names = sizes[name], [name]
        elif sizes[name] == best:
            names.append(name)
    return best, names


def parse_max_memory(max_memory: Mapping[DeviceKey, int | str] | None) -> dict[DeviceKey, int]:
    """Normalise ``max_memory`` to ``{gpu_index..., other accelerators..., "cpu", "disk"?: bytes}``.

    ``None`` means: the free memory of every visible GPU and the available RAM. Keys may be GPU
    indices (``0``), ``"cuda:0"``, ``"mps"``, ``"xpu:0"``, ``"cpu"`` or ``"disk"``; values are
    bytes or sizes like ``"10GiB"`` / ``"200MB"``.

    Examples:
        >>> parse_max_memory({"cpu": "1KiB", "cuda:1": 10, 0: "1KB"})
        {0: 1000, 1: 10, 'cpu': 1024}
    """
    if max_memory is None:
        return _available_memory()
    if not isinstance(max_memory, Mapping):
        raise ConfigurationError(
            f"max_memory={describe(max_memory)}: expected a dict like {{0: '10GiB', 'cpu': '30GiB'}}."
        )
    parsed: dict[DeviceKey, int] = {}
    for key, value in max_memory.items():
        parsed[_device_key(key)] = _parse_bytes(value, key)
    return dict(sorted(parsed.items(), key=lambda item: _device_rank(item[0])))


def _device_key(key: object) -> DeviceKey:
    """One spelling per device: GPU indices as ints, everything else as a device string."""
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    if isinstance(key, torch.device):
        key = str(key)
    if isinstance(key, str):
        if key in _HOST or key == "mps":
            return key
        if key == "cuda" or re.fullmatch(r"cuda:\d+", key):
            return int(key.partition(":")[2] or 0)
        if re.fullmatch(r"[a-z]+:\d+", key):
            return key
    raise ConfigurationError(
        f"max_memory key {describe(key)} is not a device: use a GPU index (0), 'cuda:0', 'mps', 'xpu:0', 'cpu' or 'disk'."
    )


def _device_rank(key: DeviceKey) -> tuple[int, str, int]:
    """Fill order: GPUs by index, other accelerators, then the CPU, then the disk."""
    if isinstance(key, int):
        return (0, "", key)
    if key in _HOST:
        return (2 + _HOST.index(key), key, 0)
    return (1, key, 0)


def _parse_bytes(value: object, key: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE_RE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigurationError(
            f"max_memory[{key!r}]={describe(value)}: expected bytes (an int >= 0) or a size like '10GiB' or '500MB'."
        )
    return int(Decimal(match.group(1)) * _UNITS[(match.group(2) or "").upper()])  # 60.6KB: 60600


def _available_memory() -> dict[DeviceKey, int]:
    """Free memory of each visible GPU and available RAM, as ``max_memory=None`` promises."""
    memory: dict[DeviceKey, int] = {}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            memory[index] = torch.cuda.mem_get_info(index)[0]
    memory["cpu"] = _available_ram()
    return memory


def _available_ram() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def balanced_memory(
    max_memory: dict[DeviceKey, int],
    sizes: dict[str, int],
    layer_size: int,
    *,
    low_zero: bool = False,
) -> dict[DeviceKey, int]:
    """Caps that spread the model evenly over the GPUs (``device_map="balanced"``).

    Each GPU but the last gets ``ceil(model / GPUs) + largest layer``; with ``low_zero`` GPU 0
    gets only what the other GPUs cannot hold. With fewer than two GPUs nothing changes.
    """
    gpus = [key for key in max_memory if key not in _HOST]
    if len(gpus) < 2:
        return dict(max_memory)
    share = math.ceil(sizes[""] / (len(gpus) - int(low_zero))) + layer_size
    balanced = dict(max_memory)
    for gpu in gpus[:-1]:
        balanced[gpu] = min(share, max_memory[gpu])
    if low_zero:
        rest = sum(max_memory[gpu] for gpu in gpus[1:])
        balanced[gpus[0]] = min(max(0, sizes[""] - rest), max_memory[gpus[0]])
    return balanced


def fill_devices(
    model: torch.nn.Module,
    max_memory: dict[DeviceKey, int],
    no_split: list[str],
    sizes: dict[str, int],
    *,
    offload_buffers: bool = False,
    clean: bool = True,
) -> DeviceMap:
    """Place modules on devices in order; see ``infer_auto_device_map`` for the rules."""
    fill = _Fill(model, max_memory, no_split, sizes)
    device_map = fill.run()
    if not offload_buffers:
        fill.warn_on_offloaded_buffers(device_map)
    return clean_device_map(device_map) if clean else device_map


class _Fill:
    """The state of one greedy fill: what is left to place and how full each device is."""

    def __init__(
        self,
        model: torch.nn.Module,
        max_memory: dict[DeviceKey, int],
        no_split: list[str],
        sizes: dict[str, int],
    ) -> None:
        self.model, self.sizes, self.no_split = model, sizes, no_split
        self.limits: dict[DeviceKey, int | None] = {**max_memory, "disk": None}
        self.devices = list(self.limits)
        gpus = [key for key in self.devices if key not in _HOST]
        self.main_devices = ["mps"] if "mps" in gpus else ([gpus[0], "cpu"] if gpus else ["cpu"])
        self.used = dict.fromkeys(self.devices, 0)
        self.tied = find_tied_parameters(model)
        self.todo: list[_Item] = _direct_items(model, "")

    def run(self) -> DeviceMap:
        device_map: DeviceMap = {}
        index = 0
        reserve, reserve_names = self._largest()
        while self.todo:
            name, item = self.todo.pop(0)
            reserve_names = [n for n in reserve_names if n != name and not n.startswith(name + ".")]
            if not reserve_names:
                reserve, reserve_names = self._largest()
            device = self.devices[index]
            limit = self.limits[device]
            reserved = reserve if device in self.main_devices else 0
            partners = self._tied_partners(name)
            size = self.sizes[name] + sum(self.sizes[partner] for partner in partners)
            if limit is None or self.used[device] + size <= limit - reserved:
                self.used[device] += size
                for placed in (name, *partners):
                    device_map[placed] = device
                self.todo = [entry for entry in self.todo if entry[0] not in partners]
                continue
            children = list(item.named_children()) if isinstance(item, torch.nn.Module) else []
            if children and type(item).__name__ not in self.no_split:
                self.todo = _direct_items(item, name) + self.todo
                reserve, reserve_names = self._largest()
                continue
            # Neither it nor its parts fit: the device is full (its reserve stays booked).
            self.used[device] += reserved
            index += 1
            self.todo.insert(0, (name, item))
        return device_map

    def _largest(self) -> tuple[int, list[str]]:
        modules = [(n, m) for n, m in self.todo if isinstance(m, torch.nn.Module)]
        return largest_layer(modules, self.sizes, self.no_split)

    def _tied_partners(self, name: str) -> list[str]:
        """Entries still to place that hold a weight tied to one inside ``name``: they go along."""
        prefix = name + "."
        partners: list[str] = []
        for group in self.tied:
            inside = [p for p in group if (p + ".").startswith(prefix)]
            if not inside or len(inside) == len(group):
                continue
            for param in group:
                if param in inside:
                    continue
                holder = next(
                    (n for n, _ in self.todo if param == n or param.startswith(n + ".")), None
                )
                if holder is not None and holder not in partners:
                    partners.append(holder)
        return partners

    def warn_on_offloaded_buffers(self, device_map: DeviceMap) -> None:
        """Buffers of offloaded modules stay on the main device: say so when they overflow it."""
        main = self.main_devices[0]
        offloaded = ("disk",) if main in ("cpu", "mps") else _HOST
        extra = sum(
            tensor_bytes(buffer)
            for name, buffer in self.model.named_buffers()
            if lookup_device(name, device_map) in offloaded
        )
        limit = self.limits[main]
        if extra and limit is not None and self.used[main] + extra > limit:
            warnings.warn(
                f"infer_auto_device_map: the buffers of offloaded modules ({extra} bytes) stay on "
                f"{main!r} and overflow its max_memory ({limit} bytes). Pass offload_buffers=True "
                f"or raise max_memory[{main!r}].",
                stacklevel=3,
            )


def _direct_items(module: torch.nn.Module, name: str) -> list[_Item]:
    """A module's direct parameters, children and direct buffers, with full names."""
    prefix = f"{name}." if name else ""
    return [
        *((prefix + n, p) for n, p in module.named_parameters(recurse=False)),
        *((prefix + n, c) for n, c in module.named_children()),
        *((prefix + n, b) for n, b in module.named_buffers(recurse=False)),
    ]


def clean_device_map(device_map: DeviceMap, module_name: str = "") -> DeviceMap:
    """Collapse entries whose siblings all share a device into their parent's entry.

    Examples:
        >>> clean_device_map({"0": "cpu", "1": "cpu"})
        {'': 'cpu'}
    """
    prefix = f"{module_name}." if module_name else ""
    values = [v for k, v in device_map.items() if k.startswith(prefix)]
    if len(set(values)) == 1 and len(values) > 1:
        for key in [k for k in device_map if k.startswith(prefix)]:
            del device_map[key]
        device_map[module_name] = values[0]
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {
        ".".join(k.split(".")[:depth])
        for k in device_map
        if k.startswith(prefix) and len(k) > len(module_name)
    }
    for child in sorted(children):
        clean_device_map(device_map, child)
    return device_map


def lookup_device(name: str, device_map: DeviceMap) -> DeviceKey | None:
    """The device of tensor or module ``name``: its longest prefix in the map (None if none)."""
    probe = name
    while True:
        if probe in device_map:
            return device_map[probe]
        if not probe:
            return None
        probe = probe.rpartition(".")[0]


def check_device_map(model: torch.nn.Module, device_map: DeviceMap) -> None:
    """Raise ConfigurationError naming the parameters and buffers ``device_map`` leaves out."""
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers(remove_duplicate=False)]
    missing = [name for name in names if lookup_device(name, device_map) is None]
    if missing:
        shown = ", ".join(missing[:10]) + (
            f" (+{len(missing) - 10} more)" if len(missing) > 10 else ""
        )
        raise ConfigurationError(
            f"device_map gives no device to {len(missing)} tensors: {shown}. Add their modules "
            f"(or '' for everything) to the map, or use device_map='auto'."
        )


def class_names(classes: list[str | type] | str | type | None) -> list[str]:
    """``no_split_module_classes`` / ``preload_module_classes`` as a list of class names."""
    if classes is None:
        return []
    names = [classes] if isinstance(classes, str | type) else list(classes)
    if not all(isinstance(name, str | type) for name in names):
        raise ConfigurationError(
            f"module classes {describe(classes)}: expected class names, e.g. ['LlamaDecoderLayer']."
        )
    return [name if isinstance(name, str) else name.__name__ for name in names]


def normalize_device_map(device_map: object) -> DeviceMap:
    """Device values as GPU indices (``"cuda:1"`` -> 1), ``"cpu"``, ``"disk"`` or device strings."""
    if not isinstance(device_map, dict):
        raise ConfigurationError(
            f"device_map={describe(device_map)}: expected a dict like {{'': 'cpu'}} or {{'layers.0': 0, 'layers.1': 'disk'}}."
        )
    normalized: DeviceMap = {}
    for name, device in device_map.items():
        if isinstance(device, torch.device):
            device = str(device)
        if isinstance(device, str) and re.fullmatch(r"cuda:\d+", device):
            device = int(device[5:])
        if not isinstance(device, int | str) or isinstance(device, bool):
            raise ConfigurationError(
                f"device_map[{name!r}]={describe(device)}: expected a GPU index, 'cpu', 'disk' or a device string."
            )
        normalized[name] = device
    return normalized


def torch_device(device: DeviceKey | torch.device) -> torch.device:
    """A map value as a ``torch.device``; an int is an index of the machine's accelerator."""
    if isinstance(device, int):
        accelerator = getattr(torch, "accelerator", None)
        current = accelerator.current_accelerator() if accelerator is not None else None
        return torch.device(current.type if current is not None else "cuda", device)
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ConfigurationError(f"{describe(device)} is not a torch device: {err}") from err


def main_device(device_map: DeviceMap | None) -> torch.device:
    """Where offloaded modules run: the first accelerator of the map, else the CPU."""
    for device in (device_map or {}).values():
        if device not in _HOST:
            return torch_device(device)
    return torch.device("cpu")
