"""Human sizes in and out: parse '5GB' the way Hugging Face does, print binary units with one decimal."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

try:  # pragma: no cover - resource is missing only on Windows
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]


# --------------------------------------------------------------------------------------------------------------
# sizes
# --------------------------------------------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_SIZE_HELP = (
    "expected a number with an optional unit: '5GB' (5*10**9, as Hugging Face), '5GiB' or '5G' (5*2**30), "
    "'500MB', '1.5T', or a plain byte count"
)


def parse_size(text: str | int) -> int:
    """Parse a human size the way Hugging Face's convert_file_size_to_int does, plus bare K/M/G/T/P.

    KB/MB/GB/TB/PB are decimal and KiB/MiB/GiB/TiB/PiB binary (case-insensitive), as in HF; bare K/M/G/T/P
    are binary.  Like HF, a lowercase final ``b`` on a decimal unit ("5Gb") means bits and is divided by 8.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise TypeError(f"size must be a str or int, got {type(text).__name__}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"invalid size {text!r}: must not be negative")
        return text
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"invalid size {text!r}: {_SIZE_HELP}")
    number_text, unit = match.groups()
    try:
        number = Decimal(number_text)
    except InvalidOperation as err:  # pragma: no cover - the regex only lets decimals through
        raise ValueError(f"invalid size {text!r}: {_SIZE_HELP}") from err
    upper = unit.upper()
    bits = False
    if upper in ("", "B"):
        if unit == "b":
            raise ValueError(f"invalid size {text!r}: a bare 'b' would mean bits; write 'B' for bytes")
        multiplier = 1
        if number != number.to_integral_value():
            raise ValueError(f"invalid size {text!r}: a byte count must be a whole number")
    elif len(upper) == 1 and upper in _BINARY:
        multiplier = _BINARY[upper]
    elif len(upper) == 3 and upper.endswith("IB") and upper[0] in _BINARY:
        multiplier = _BINARY[upper[0]]
    elif len(upper) == 2 and upper.endswith("B") and upper[0] in _DECIMAL:
        multiplier = _DECIMAL[upper[0]]
        bits = unit.endswith("b")
    else:
        raise ValueError(f"invalid size {text!r}: unknown unit {unit!r}; {_SIZE_HELP}")
    value = int(number * multiplier)
    return value // 8 if bits else value


_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: float) -> str:
    """The one size formatter (humanize, once a dependency, printed "Bytes" and dropped the decimal): binary units, one decimal ("1.5 GiB"); plain bytes below 1 KiB."""
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in _UNITS:
        value /= 1024
        if value < 1023.95 or unit == _UNITS[-1]:
            return f"{sign}{value:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


_COUNT = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_count(text: str) -> int:
    """Parse a parameter count the way model cards write it: '500M', '1.5B', '7B' (decimal; G = B).

    Not `parse_size`: there '1B' is one byte and '2M' is 2 MiB, so a '7B' demo would have had 7 parameters.
    """
    match = _SIZE_RE.match(text)
    if not match or match.group(2).upper() not in _COUNT:
        raise ValueError(f"invalid count {text!r}: expected a number with an optional K, M, B (or G) or T")
    value = Decimal(match.group(1)) * _COUNT[match.group(2).upper()]
    if value != value.to_integral_value():
        raise ValueError(f"invalid count {text!r}: not a whole number")
    return int(value)




def plural(n: int, word: str) -> str:
    """`1 rank`, `2 ranks`: the count with its noun (English plural by `s`)."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def format_count(n: int) -> str:
    """Counts for people: 1,234 below a million, then 12.3M and 1.20B (what the CLI and the TUI both show)."""
    if n >= 1_000_000_000:
        return f"{n / 1e9:.2f}B"
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n:,}"
