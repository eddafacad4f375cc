"""Replayable case files: one :class:`~csagate.gates.cases.Case` as JSON (``csagate fuzz --out``
writes them, ``csagate run --case-file`` replays them).

Schema ``csagate.case``, version 1::

    {"schema": "csagate.case", "version": 1,
     "case": {every Case field: name, coff, d, lens, kind, why, ratio, input_seed, grad_seed,
              pad_seed, scale, pad_rows, pad_tokens, inputs, deterministic},
     "contract_ratio": 4,                      # the contract family that judges it
     "failing": ["G2 out", ...],               # what failed when it was written
     "implementation": "mine",                 # the implementation it failed for
     "origin": {"seed": 7, "trial": 12, "case": {the trial's case before shrinking}, ...},
     "csagate_version": "0.2.0", "contract_version": "2"}

``case`` needs ``name``, ``coff``, ``d``, ``lens`` and ``ratio``; the other fields default as
in :class:`Case`. Reading is strict: a wrong type, an unknown field, a value outside its range
(:data:`RANGES`), a ratio without a contract or a newer version is a :class:`CaseFileError`
with one line naming the file and the field. No torch: loading a case file is checked before
anything runs, and before anything is allocated.

The ranges (docs/CONTRACT.md section 9): at most ``MAX_SEGMENTS`` segments and ``MAX_TOKENS``
tokens in all (32 times the largest named case), head dims 1-1024 (the widest any kernel
takes), at most ``MAX_PAD`` capacity rows and token rows, seeds below 2^63, the input scale a
finite number in [2^-10, 2^10]. A file larger than ``MAX_FILE_BYTES`` is not read.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from csagate.gates.cases import INPUTS, KINDS, Case
from csagate.gates.contracts import CONTRACT_VERSION, CONTRACTS

SCHEMA = "csagate.case"
VERSION = 1
FIELDS = {f.name: f for f in dataclasses.fields(Case)}
REQUIRED = ("name", "coff", "d", "lens", "ratio")

MAX_SEGMENTS = 4096
MAX_TOKENS = 1 << 22            # 32 x the largest named case (131072 tokens)
MAX_HEAD_DIM = 1024             # the widest head dim any kernel takes (kernels/validate.py)
MAX_PAD = 1 << 16               # capacity padding rows, token-capacity rows
SEED_LIMIT = 1 << 63            # torch.Generator.manual_seed takes less
SCALE_RANGE = (2.0 ** -10, 2.0 ** 10)
MAX_FILE_BYTES = 1 << 20
# The integer fields and their ranges [low, high]: what a case file may hold.
RANGES = {"d": (1, MAX_HEAD_DIM), "pad_rows": (0, MAX_PAD), "pad_tokens": (0, MAX_PAD),
          "input_seed": (0, SEED_LIMIT - 1), "grad_seed": (0, SEED_LIMIT - 1),
          "pad_seed": (0, SEED_LIMIT - 1), "segment": (0, MAX_TOKENS)}


class CaseFileError(ValueError):
    """A case file that cannot be replayed: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class CaseFile:
    """A loaded case file: the case, the contract ratio, and what the file recorded."""

    case: Case
    contract_ratio: int
    failing: tuple[str, ...] = ()
    implementation: str | None = None
    origin: dict[str, Any] = field(default_factory=dict)
    path: str = ""


def case_dict(case: Case) -> dict[str, Any]:
    doc = dataclasses.asdict(case)
    doc["lens"] = list(case.lens)
    return doc


def document(case: Case, *, failing=(), implementation: str | None = None,
             origin: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of one case file."""
    from csagate import __version__

    return {"schema": SCHEMA, "version": VERSION, "case": case_dict(case),
            "contract_ratio": case.ratio, "failing": list(failing),
            "implementation": implementation, "origin": origin or {},
            "csagate_version": __version__, "contract_version": CONTRACT_VERSION}


def write(path: Path | str, case: Case, **kwargs) -> Path:
    path = Path(path)
    path.write_text(json.dumps(document(case, **kwargs), indent=2, allow_nan=False) + "\n")
    return path


def file_name(case: Case, seed: int, trial: int) -> str:
    """``fuzz-s7-t12-r4-c1d33.json``: the seed and trial it came from, its config."""
    return f"fuzz-s{seed}-t{trial}-r{case.ratio}-c{case.coff}d{case.d}.json"


def _int(value, what: str, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum \
            or (maximum is not None and value > maximum):
        span = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise CaseFileError(f"{what} must be an integer {span}, got {_short(value)}")
    return value


def _short(value) -> str:
    """A value as an error line shows it: at most 60 characters of its repr."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_field(name: str, value) -> Any:
    """The value of Case field ``name`` from JSON, or CaseFileError."""
    where = f"case.{name}"
    if name in ("name", "why"):
        if not isinstance(value, str):
            raise CaseFileError(f"{where} must be a string, got {value!r}")
        return value
    if name == "lens":
        if not isinstance(value, list) or not value or len(value) > MAX_SEGMENTS:
            raise CaseFileError(f"{where} must be a list of 1 to {MAX_SEGMENTS} segment "
                                f"lengths, got {_short(value)}")
        lens = tuple(_int(n, f"{where}[{i}]", *RANGES["segment"]) for i, n in enumerate(value))
        if sum(lens) > MAX_TOKENS:
            raise CaseFileError(f"{where} holds {sum(lens)} tokens, more than {MAX_TOKENS}")
        return lens
    if name == "ratio":
        if _int(value, where, 1) not in CONTRACTS:
            raise CaseFileError(f"{where} {value} has no contract (ratios: "
                                f"{', '.join(map(str, CONTRACTS))})")
        return value
    if name == "coff":
        if value not in (1, 2) or isinstance(value, bool):
            raise CaseFileError(f"{where} must be 1 or 2, got {value!r}")
        return value
    if name in ("kind", "inputs"):
        allowed = KINDS if name == "kind" else INPUTS
        if value not in allowed:
            raise CaseFileError(f"{where} must be one of {', '.join(allowed)}, got {value!r}")
        return value
    if name == "scale":
        low, high = SCALE_RANGE
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or not low <= value <= high:
            raise CaseFileError(f"{where} must be a finite number in [2^-10, 2^10], got "
                                f"{_short(value)}")
        return float(value)
    if name == "deterministic":
        if not isinstance(value, bool):
            raise CaseFileError(f"{where} must be true or false, got {value!r}")
        return value
    return _int(value, where, *RANGES[name])   # d, seeds, pad_rows, pad_tokens


def case_from_dict(doc) -> Case:
    if not isinstance(doc, dict):
        raise CaseFileError(f"case must be an object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise CaseFileError(f"case has unknown field(s) {', '.join(unknown)} (known: "
                            f"{', '.join(FIELDS)})")
    missing = [name for name in REQUIRED if name not in doc]
    if missing:
        raise CaseFileError(f"case lacks {', '.join(missing)}")
    values = {name: _check_field(name, value) for name, value in doc.items()}
    values.setdefault("kind", "fuzz")
    values.setdefault("why", "replayed from a case file")
    return Case(**values)


def parse(doc) -> CaseFile:
    """A case file's document, checked (CaseFileError without the file's name)."""
    if not isinstance(doc, dict):
        raise CaseFileError(f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise CaseFileError(f"schema must be {SCHEMA!r}, got {doc.get('schema')!r}")
    version = _int(doc.get("version"), "version", 1)
    if version > VERSION:
        raise CaseFileError(f"version {version} was written by a newer csagate (this one "
                            f"reads up to {VERSION})")
    case = case_from_dict(doc.get("case"))
    ratio = doc.get("contract_ratio", case.ratio)
    if ratio != case.ratio:
        raise CaseFileError(f"contract_ratio {ratio!r} differs from case.ratio {case.ratio}")
    failing = doc.get("failing", [])
    if not isinstance(failing, list) or not all(isinstance(f, str) for f in failing):
        raise CaseFileError(f"failing must be a list of strings, got {failing!r}")
    impl = doc.get("implementation")
    if impl is not None and not isinstance(impl, str):
        raise CaseFileError(f"implementation must be a string, got {impl!r}")
    origin = doc.get("origin", {})
    if not isinstance(origin, dict):
        raise CaseFileError(f"origin must be an object, got {origin!r}")
    return CaseFile(case, case.ratio, tuple(failing), impl, origin)


def load(path: Path | str) -> CaseFile:
    """The case file at ``path``; CaseFileError with one line naming it."""
    path = Path(path)
    try:
        if path.is_file() and path.stat().st_size > MAX_FILE_BYTES:
            raise CaseFileError(f"{path}: {path.stat().st_size} bytes, more than a case file "
                                f"holds ({MAX_FILE_BYTES})")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CaseFileError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise CaseFileError(f"{path}: not UTF-8 text") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaseFileError(f"{path}: not JSON ({exc.msg} at line {exc.lineno} column "
                            f"{exc.colno})") from exc
    except RecursionError as exc:
        raise CaseFileError(f"{path}: nested too deeply to be a case file") from exc
    try:
        found = parse(doc)
    except CaseFileError as exc:
        raise CaseFileError(f"{path}: {exc}") from exc
    return dataclasses.replace(found, path=str(path))
