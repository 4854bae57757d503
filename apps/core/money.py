"""Amounts as people read them: the platform counts integer micro-credits."""

MICRO = 1_000_000  # micro-credits in a credit


def credits(micro: int) -> str:
    """Micro-credits as a credit amount without trailing zeros: 2500000 → '2.5'."""
    whole, frac = divmod(abs(micro), MICRO)
    text = f"{whole}.{frac:06d}".rstrip("0").rstrip(".")
    return f"-{text}" if micro < 0 else text
