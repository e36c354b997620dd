"""Upstream's answer normalization and comparison, the table hash, and the observation format."""

from __future__ import annotations

import random

import pytest
from agentrl_env_db.backend import RowCollector
from agentrl_env_db.scoring import clean_answer, combine_hashes, compare_results, normalize_value, table_hash


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "0"), ("NULL", "0"), ("nan", "0"), ("-Infinity", "0"), ("  ", "0"), ("None", "0"),
        ("45%", "45"), (" 12.5 % ", "12.5"), ("1,234,567", "1234567"), ("1,2%", "1,2"),  # % returns early
        ("[1,2]", "[1,2]"), ("Decision", "Decision"),
    ],
)
def test_normalize_value(value, expected):
    assert normalize_value(value) == expected


@pytest.mark.parametrize(
    ("answer", "truth", "kind", "correct"),
    [
        (["Women +60kg Bronze"], ["Women +60kg Bronze"], "other", True),
        (["women +60kg bronze"], ["Women +60kg Bronze"], "other", False),  # upstream is case-sensitive
        (["3.005"], ["3"], "aggregation-AVG", True),  # |3.005 - 3| <= 0.01
        (["3.02"], ["3"], "aggregation-AVG", False),
        (["1,000"], ["1000.0"], "aggregation-SUM", True),
        (["50%"], ["50"], "comparison", True),
        ([], ["0"], "counting", False),  # [] and ["0"]: lengths differ, "0" is a float, [] vacuously too
        (["null"], ["0"], "counting", True),
        (["b", "a"], ["a", "b"], "other", True),  # sets
        (["a", "a", "b"], ["a", "b"], "other", True),  # sets ignore duplicates
        (["1", "2"], ["2.001", "1"], "ranking", True),  # float matching, one to one
        (["1", "1"], ["1", "2"], "ranking", False),
        (["'quoted'"], ["quoted"], "other", True),  # quotes stripped
        ("[('17',)]", ["17"], "counting", True),  # a MySQL result string
        ("[(Decimal('2.5'),)]", ["2.5"], "aggregation-AVG", False),  # not a literal: upstream's fallback split
    ],
)
def test_compare_results(answer, truth, kind, correct):
    assert compare_results(answer, truth, kind) is correct


def test_clean_answer_of_mysql_result_keeps_one_value_tuples_only():
    assert clean_answer("[('a',), ('b', 'c'), (3,)]") == ["a", "3"]
    assert clean_answer("[(293.0,)]") == ["293.0"]
    assert clean_answer(None) == ["0"]


def test_modification_compares_hash_strings():
    stored = "[('fa81a61f9a648475594128fa51bfa80d',)]"
    assert compare_results("fa81a61f9a648475594128fa51bfa80d", stored, "UPDATE")
    assert not compare_results("fa81a61f9a648475594128fa51bfa80e", stored, "INSERT")


def test_table_hash_matches_mariadb_values():
    # Expected values computed by MariaDB 10.11 with upstream's query (CONCAT_WS skips NULL).
    rows = [("a", "b"), ("c", None), ("Zürich", "1,5")]
    assert table_hash(rows) == "502dab3a7fd429db6c63b3540aae9537"
    assert table_hash([]) is None
    assert combine_hashes([None]) == "None"
    assert combine_hashes(["b", "a"]) == "a_b"


def test_table_hash_truncates_like_group_concat_max_len():
    rows = [(str(i),) for i in range(400)]  # 400 * 6 - 1 characters before the cut
    assert table_hash(rows) == table_hash(rows, max_len=1024)
    assert table_hash(rows) != table_hash(rows, max_len=10_000)


def _collect(rows, limit=800, max_rows=10_000, max_bytes=1 << 20):
    collector = RowCollector(limit, max_rows, max_bytes)
    for row in rows:
        if not collector.add(row):
            break
    return collector


def test_row_collector_equals_upstream_string_and_stops_early():
    rng = random.Random(0)
    for n in range(0, 120, 7):
        rows = [tuple(rng.choice(["x" * rng.randint(0, 30), None, 12, 3.5]) for _ in range(3)) for _ in range(n)]
        expected = str(rows)
        expected = expected[:800] + "[TRUNCATED]" if len(expected) > 800 else expected
        collector = _collect(rows)
        assert collector.text() == expected
    # Exactly at the limit and one past it.
    rows = [("a" * 793,)]  # "[('" + 793 + "',)]" = 800 characters
    assert _collect(rows).text() == str(rows)
    rows = [("a" * 794,)]
    assert _collect(rows).text() == str(rows)[:800] + "[TRUNCATED]"
    assert _collect([]).text() == "[]"


def test_row_collector_caps_rows_and_bytes():
    many = [(str(i),) for i in range(100)]
    capped = _collect(many, max_rows=10)
    assert capped.capped and capped.rows == 10 and capped.text().endswith("[TRUNCATED]")
    big = [("y" * 1000,)] * 50
    capped = _collect(big, max_bytes=5000)
    assert capped.capped and capped.rows == 5
