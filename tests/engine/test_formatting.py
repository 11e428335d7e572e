"""engine.formatting is the one byte formatter (binary by default, decimal where the source is decimal) and
writes counts with their noun."""

from engine.formatting import count_of, format_bytes, significant


def test_binary_bytes():
    assert format_bytes(None) == "n/a"
    assert format_bytes(512 * 2**20) == "512 MiB" and format_bytes(1.5 * 2**30) == "1.5 GiB"
    assert format_bytes(300) == "300 B" and format_bytes(2048, sep="\u00a0") == "2.0\u00a0KiB"


def test_decimal_bytes_keep_three_significant_digits():
    assert format_bytes(640, decimal=True) == "640 B"
    assert format_bytes(1_250_000_000, decimal=True) == "1.25 GB"
    assert format_bytes(13_000_000, decimal=True, sep="\u00a0") == "13\u00a0MB"
    assert format_bytes(1500, decimal=True) == "1.5 kB"
    assert significant(0.03261) == "0.0326" and significant(103.4) == "103" and significant(1.0) == "1"


def test_a_count_takes_its_noun_in_the_number_it_needs():
    assert count_of(1, "volume") == "1 volume" and count_of(0, "volume") == "0 volumes"
    assert count_of(3, "generated volume") == "3 generated volumes"
    assert count_of(2, "entry", "entries") == "2 entries" and count_of(1, "entry", "entries") == "1 entry"
