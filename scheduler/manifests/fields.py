"""Kubernetes quantities and GPU names: `500m`, `16Gi`, `NVIDIA-A100-SXM4-80GB` → our units and models."""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation

from scheduler.models import GpuModel

GPU = "nvidia.com/gpu"
GPU_MODEL = "nvidia.com/gpu.model"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_LABELS = (GPU_PRODUCT, GPU_MODEL)

_QUANTITY = re.compile(r"^([+]?[0-9]+(?:\.[0-9]*)?|[+]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|([a-zA-Z]*))$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)}
_DECIMAL |= {"k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12)}
_DECIMAL |= {"P": Decimal(10**15), "E": Decimal(10**18)}
_MIB = Decimal(2**20)


class QuantityError(ValueError):
    pass


def quantity(value: object) -> Decimal:
    """A Kubernetes resource quantity as a number of base units (cores, bytes)."""
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"'{value}' is not a quantity")
    text = str(value).strip()
    match = _QUANTITY.match(text) if len(text) <= 64 else None
    if match is None:
        raise QuantityError(f"'{text}' is not a quantity")
    number, exponent, suffix = match[1], match[2], match[3] or ""
    try:
        amount = Decimal(number + (exponent or ""))
    except InvalidOperation:
        raise QuantityError(f"'{text}' is not a quantity") from None
    if suffix in _BINARY:
        return amount * _BINARY[suffix]
    if suffix in _DECIMAL:
        return amount * _DECIMAL[suffix]
    raise QuantityError(f"'{text}' has an unknown unit '{suffix}'")


def cpu_milli(value: object) -> int:
    """`500m` → 500, `2` → 2000, `0.5` → 500 (rounded up to a whole milli-CPU, as Kubernetes does)."""
    milli = quantity(value) * 1000
    return int(milli.to_integral_value(rounding="ROUND_CEILING"))


def memory_mib(value: object) -> int:
    """`16Gi` → 16384, `1G` → 954 (rounded up to a whole MiB), `512Mi` → 512."""
    mib = quantity(value) / _MIB
    return int(mib.to_integral_value(rounding="ROUND_CEILING"))


def mib_quantity(mib: int) -> str:
    """MiB as the shortest exact quantity: 16384 → `16Gi`, 1500 → `1500Mi`."""
    return f"{mib // 1024}Gi" if mib and mib % 1024 == 0 else f"{mib}Mi"


def cpu_quantity(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _norm(name: str) -> str:
    return re.sub(r"[\s_-]+", "-", name.strip()).lower()


def family(model: GpuModel) -> str:
    """The product family a catalog name starts with: `A100-80GB` → `A100`, `L40S` → `L40S`."""
    return model.name.split("-")[0]


def models_named(value: str, catalog: Iterable[GpuModel]) -> list[GpuModel]:
    """The catalog models a manifest's GPU name means, any of them.

    A catalog name (`A100-80GB`), a name GPU Feature Discovery puts on nodes as
    `nvidia.com/gpu.product` (NVML's product name with dashes: `NVIDIA-A100-SXM4-80GB`,
    `Tesla-T4`), or a family (`A100`: every A100 in the catalog). Empty when none matches."""
    wanted = _norm(value)
    models = list(catalog)
    exact = [m for m in models if _norm(m.name) == wanted]
    if exact:
        return exact
    product = [m for m in models if any(_norm(n) == wanted for n in m.nvml_names)]
    if product:
        return product
    return [m for m in models if _norm(family(m)) == wanted]


def product_label(model: GpuModel) -> str:
    """What GPU Feature Discovery labels a node of this model with (`nvidia.com/gpu.product`),
    or the catalog name for a model whose NVML names the catalog does not know."""
    if not model.nvml_names:
        return model.name
    return re.sub(r"\s+", "-", model.nvml_names[0].strip())
