"""Numeric ranges as GBNF: the JSON text of the integers, or of the numbers, between two bounds.

A range is written digit by digit, as one compares two numbers of the same length: a bound of n
digits costs O(n) alternatives of O(n) text each, however far apart the bounds are, so
``minimum``/``maximum`` are enforced by the grammar itself. The texts written keep the converter's
limits (at most 16 digits on each side of the point, no exponent: fewer texts, all in range).

Numbers compare as JSON validators compare them: a text with a fraction is read as a float. So
an exclusive bound, and an integer bound no float holds exactly, become the nearest float inside
the range first; then every text that is at least (or at most) that float's shortest decimal reads
as a float inside the range (rounding to the nearest float never crosses a float).
"""

from __future__ import annotations

import math
from decimal import Decimal

INT_DIGITS = 16           # as j-int-part: at most 16 digits before the point
FRAC_DIGITS = 16          # and after it
MAX_BOUND_DIGITS = 64     # a bound with more digits before the point cannot be written out

_ANY = "[0-9]"


class BoundTooLarge(ValueError):
    """A bound beyond MAX_BOUND_DIGITS: the range cannot be written."""


def _any(k: int) -> str:
    return " ".join([_ANY] * k)


def _digit_class(lo: int, hi: int) -> str:
    return f'"{lo}"' if lo == hi else f"[{lo}-{hi}]"


def _alts(parts: list[str]) -> str:
    parts = [p for p in parts if p]
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


# integers --------------------------------------------------------------------------------------

def _at_least(s: str) -> str:
    """Digit strings of len(s) that are >= s."""
    if not s.strip("0"):
        return _any(len(s))
    head, rest = int(s[0]), s[1:]
    parts = [f'"{head}" {_at_least(rest)}'.strip() if rest else f'"{head}"']
    if head < 9:
        parts.append(f"{_digit_class(head + 1, 9)} {_any(len(rest))}".strip())
    return _alts(parts)


def _at_most(s: str) -> str:
    """Digit strings of len(s) that are <= s."""
    if not s.strip("9"):
        return _any(len(s))
    head, rest = int(s[0]), s[1:]
    parts = []
    if head > 0:
        parts.append(f"{_digit_class(0, head - 1)} {_any(len(rest))}".strip())
    parts.append(f'"{head}" {_at_most(rest)}'.strip() if rest else f'"{head}"')
    return _alts(parts)


def _same_length(x: str, y: str) -> str:
    """Digit strings of len(x) == len(y) from x to y (x <= y)."""
    i = 0
    while i < len(x) and x[i] == y[i]:
        i += 1
    prefix = f'"{x[:i]}"' if i else ""
    if i == len(x):
        return prefix
    a, b, xr, yr = int(x[i]), int(y[i]), x[i + 1:], y[i + 1:]
    low_full, high_full = not xr.strip("0"), not yr.strip("9")
    lo_mid, hi_mid = (a if low_full else a + 1), (b if high_full else b - 1)
    parts = []
    if not low_full:
        parts.append(f'"{a}" {_at_least(xr)}')
    if lo_mid <= hi_mid:
        parts.append(f"{_digit_class(lo_mid, hi_mid)} {_any(len(xr))}".strip())
    if not high_full:
        parts.append(f'"{b}" {_at_most(yr)}')
    return f"{prefix} {_alts(parts)}".strip()


def _magnitudes(a: int, b: int) -> str:
    """Decimal texts (no leading zeros) of the whole numbers from a to b (0 <= a <= b)."""
    parts = []
    for length in range(len(str(a)), len(str(b)) + 1):
        lo = max(a, 10 ** (length - 1) if length > 1 else 0)
        hi = min(b, 10 ** length - 1)
        if lo <= hi:
            parts.append(_same_length(str(lo), str(hi)))
    return _alts(parts)


def _cap_for(least: int) -> int:
    """The largest magnitude written: 16 digits, or as many as the least magnitude needed has."""
    digits = max(INT_DIGITS, len(str(least)))
    if digits > MAX_BOUND_DIGITS:
        raise BoundTooLarge(f"a bound of more than {MAX_BOUND_DIGITS} digits")
    return 10 ** digits - 1


def integer_range(lo: int | None, hi: int | None) -> str | None:
    """GBNF for the JSON texts of the integers from lo to hi (None: no bound), or None if there
    are none. No "-0" and no leading zeros: one text per integer."""
    cap = _cap_for(max(0, lo or 0, -(hi or 0)))
    lo = -cap if lo is None else max(lo, -cap)
    hi = cap if hi is None else min(hi, cap)
    if lo > hi:
        return None
    parts = []
    if lo < 0:
        parts.append(f'"-" {_magnitudes(max(1, -hi), -lo)}')
    if hi >= 0:
        parts.append(_magnitudes(max(0, lo), hi))
    return _alts(parts) if len(parts) > 1 else parts[0]


def integer_bounds(s: dict) -> tuple[int | None, int | None]:
    """The whole-number bounds of a schema's minimum/maximum/exclusive*."""
    lo = hi = None
    if "minimum" in s:
        lo = math.ceil(s["minimum"])
    if "exclusiveMinimum" in s:
        v = math.floor(s["exclusiveMinimum"]) + 1
        lo = v if lo is None else max(lo, v)
    if "maximum" in s:
        hi = math.floor(s["maximum"])
    if "exclusiveMaximum" in s:
        v = math.ceil(s["exclusiveMaximum"]) - 1
        hi = v if hi is None else min(hi, v)
    return lo, hi


# numbers ---------------------------------------------------------------------------------------

def _float_inside(value: int | float, up: bool, exclusive: bool) -> float | None:
    """The float nearest to ``value`` on the range's side (up: a lower bound). None: no float
    (a bound beyond the floats' range leaves that side open, or closes it)."""
    try:
        f = float(value)
    except OverflowError:
        f = math.inf if value > 0 else -math.inf
    if math.isinf(f):
        return None
    if up:
        if f < value or (exclusive and f == value):
            f = math.nextafter(f, math.inf)
    elif f > value or (exclusive and f == value):
        f = math.nextafter(f, -math.inf)
    return f


def number_bounds(s: dict) -> tuple[Decimal | None, Decimal | None] | None:
    """The inclusive decimal bounds for number texts, or None when no number is in range (a
    lower bound above every float, say)."""
    lo: Decimal | None = None
    hi: Decimal | None = None
    for key, up, exclusive in (("minimum", True, False), ("exclusiveMinimum", True, True),
                               ("maximum", False, False), ("exclusiveMaximum", False, True)):
        if key not in s:
            continue
        f = _float_inside(s[key], up, exclusive)
        if f is None:
            if (s[key] > 0) == up:      # a lower bound above every float, or an upper one below
                return None
            continue
        d = Decimal(repr(f))
        if up:
            lo = d if lo is None else max(lo, d)
        else:
            hi = d if hi is None else min(hi, d)
    if lo is not None and hi is not None and lo > hi:
        return None
    return lo, hi


def _split(d: Decimal) -> tuple[int, str]:
    """A nonnegative decimal as (whole part, fraction digits without trailing zeros)."""
    whole = int(d)
    frac = format(d - whole, "f").partition(".")[2].rstrip("0")
    return whole, frac


def _digit(f: str, i: int) -> int:
    return int(f[i]) if i < len(f) else 0


class _Fraction:
    """Fraction digit strings (at most FRAC_DIGITS; "" is no fraction) between two bounds'
    fraction digits, compared as decimals are (1.5 and 1.50 are equal). A bound is (digits,
    strict); None leaves that side open."""

    def part(self, low: tuple[str, bool] | None, high: tuple[str, bool] | None) -> str | None:
        """The fraction part of the text ('"." digits', optional or not), or None if no
        fraction fits; "" when only the empty fraction fits."""
        end, digits = self._at(0, low, high, FRAC_DIGITS)
        if digits is None:
            return "" if end else None
        return f'("." {digits})?' if end else f'"." {digits}'

    def _at(self, i: int, low, high, room: int) -> tuple[bool, str | None]:
        """After i digits equal to the tight bounds' first i: (whether the digits may end here,
        an expression for 1 to ``room`` more digits, or None)."""
        end = True
        if low is not None:
            end = not low[0][i:].strip("0") and not low[1]
        if high is not None and end and high[1]:
            end = bool(high[0][i:].strip("0"))
        if room == 0:
            return end, None
        if low is None and high is None:
            return end, f"{_ANY} {_upto(room - 1)}".strip()
        lo_d = _digit(low[0], i) if low is not None else 0
        hi_d = _digit(high[0], i) if high is not None else 9
        groups = []
        if lo_d == hi_d:
            groups.append((lo_d, lo_d, low, high))
        else:
            if low is not None:
                groups.append((lo_d, lo_d, low, None))
            a, b = lo_d + (low is not None), hi_d - (high is not None)
            if a <= b:
                groups.append((a, b, None, None))
            if high is not None:
                groups.append((hi_d, hi_d, None, high))
        parts = []
        for a, b, tight_low, tight_high in groups:
            stop, more = self._at(i + 1, tight_low, tight_high, room - 1)
            if not stop and more is None:
                continue
            tail = "" if more is None else (f"({more})?" if stop else more)
            parts.append(f"{_digit_class(a, b)} {tail}".strip())
        return end, (_alts(parts) if parts else None)


def _upto(k: int) -> str:
    """0 to k digits."""
    out = ""
    for _ in range(k):
        out = f"({_ANY} {out})?" if out else f"{_ANY}?"
    return out


def number_range(lo: Decimal | None, hi: Decimal | None) -> str | None:
    """GBNF for the JSON texts (no exponent) of numbers from lo to hi, inclusive (None: open),
    or None if no text is in range."""
    parts = []
    if lo is None or lo < 0:
        # negative numbers: their magnitudes run from -hi (or just above 0) to -lo
        bottom = (Decimal(0), True) if hi is None or hi >= 0 else (-hi, False)
        text = _magnitude_range(bottom, None if lo is None else -lo)
        if text:
            parts.append(f'"-" {text}')
    if hi is None or hi >= 0:
        text = _magnitude_range((Decimal(0), False) if lo is None or lo < 0 else (lo, False), hi)
        if text:
            parts.append(text)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else _alts(parts)


def _magnitude_range(bottom: tuple[Decimal, bool], top: Decimal | None) -> str | None:
    """Texts of nonnegative numbers from bottom (exclusive when its flag says so) to top
    (inclusive; None: as far as INT_DIGITS reach)."""
    frac = _Fraction()
    b_whole, b_frac = _split(bottom[0])
    cap = _cap_for(b_whole)
    if top is not None and top > cap:
        top = None
    low = (b_frac, bottom[1])
    t_whole, high = (cap, None) if top is None else (_split(top)[0], (_split(top)[1], False))
    if b_whole > t_whole:
        return None
    parts = []
    if b_whole == t_whole:
        f = frac.part(low, high)
        if f is not None:
            parts.append(f'"{b_whole}" {f}'.strip())
        return _alts(parts) if parts else None
    f = frac.part(low, None)
    if f is not None:
        parts.append(f'"{b_whole}" {f}'.strip())
    last = t_whole - (high is not None)
    if b_whole + 1 <= last:
        parts.append(f"{_magnitudes(b_whole + 1, last)} {frac.part(None, None)}")
    if high is not None:
        f = frac.part(None, high)
        if f is not None:
            parts.append(f'"{t_whole}" {f}'.strip())
    return _alts(parts) if parts else None
