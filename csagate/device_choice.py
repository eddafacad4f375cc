"""``--device cpu|cuda[:N]|N``: where ``run`` and ``fuzz`` judge. No torch at parse time.

``cpu`` judges a CPU-capable implementation (its ``Supports.min_compute_capability`` is None,
or its ``unavailable`` hook accepts the CPU) against the references on the CPU; the drift
check needs the production kernels and is not run there. ``cuda``, ``cuda:N`` and a bare
``N`` name a CUDA device (``N`` is what ``--device`` always took).
"""

from __future__ import annotations

from dataclasses import dataclass

import click


@dataclass(frozen=True)
class Device:
    type: str                 # "cpu" | "cuda"
    index: int = 0            # the CUDA device index (0 on the CPU)

    @property
    def cpu(self) -> bool:
        return self.type == "cpu"

    def __str__(self) -> str:
        return "cpu" if self.cpu else f"cuda:{self.index}"

    def torch(self):
        import torch

        return torch.device("cpu") if self.cpu else torch.device("cuda", self.index)


class DeviceType(click.ParamType):
    name = "device"

    def convert(self, value, param, ctx):
        if isinstance(value, Device):
            return value
        text = str(value).strip().lower()
        if text == "cpu":
            return Device("cpu")
        if text == "cuda":
            return Device("cuda", 0)
        index = text.removeprefix("cuda:")
        if index.isdigit():
            return Device("cuda", int(index))
        self.fail(f"{value!r}: expected cpu, cuda, cuda:N or N (a CUDA device index >= 0)",
                  param, ctx)

    def get_metavar(self, param, ctx=None):
        return "cpu|cuda[:N]"


DEVICE_HELP = ("Where to judge: cuda, cuda:N or N (a CUDA device, named in the header and "
               "reports), or cpu (a CPU-capable implementation against the references; the "
               "drift check, which needs the production kernels, is then not run).")


def device_option(default: str = "cuda:0"):
    return click.option("--device", "device", type=DeviceType(), default=default,
                        show_default=True, help=DEVICE_HELP)


# The drift check's reason on the CPU (the verdict's headline: "drift check " + this).
DRIFT_NA = "not run on the CPU, where the production ratio=4 kernels it needs cannot run"
