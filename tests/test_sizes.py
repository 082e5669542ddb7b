import pytest

from memfit import SizeError, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * 1024**3),
        ("16 GB", 16 * 1000**3),
        ("1.5 GB", 1_500_000_000),
        ("1.5G", int(1.5 * 1024**3)),
        ("512MiB", 512 * 1024**2),
        ("512mib", 512 * 1024**2),
        ("2048", 2048),
        ("1e9", 1_000_000_000),
        (4096, 4096),
        ("  8 KiB ", 8192),
    ],
)
def test_parse_size_accepts_what_people_type(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("banana", "is not a memory size"),
        ("-1", "negative"),
        ("-2GiB", "negative"),
        ("0", "zero"),
        ("0GiB", "zero"),
        ("12 parsecs", "unknown unit"),
        ("", "is not a memory size"),
        ("nan", "is not a memory size"),
        (True, "is not a memory size"),
    ],
)
def test_parse_size_rejects_with_a_clear_message(text, fragment):
    with pytest.raises(SizeError, match=fragment):
        parse_size(text)


def test_format_size_uses_binary_units():
    assert format_size(1610612736) == "1.50 GiB"
    assert format_size(512 * 1024**2) == "512.00 MiB"
    assert format_size(300) == "300 B"
    assert format_size(None) == "n/a"
    assert format_size(-2048) == "-2.00 KiB"
