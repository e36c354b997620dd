"""SQLite's imitation of MySQL (agentrl_env_db.sqlite_compat.translate) against a real MariaDB:
the same statements in a session of each backend give the same answers."""

from __future__ import annotations

import anyio
import attrs
import pytest
from agentrl_env_db.config import DBConfig
from agentrl_env_db.env import DBEnvironment
from agentrl_env_db.sqlite_compat import MySQLSyntaxError, mysql_num, translate

from agentrl_core.env import assistant_tool_call

SETUP = [
    "CREATE TABLE dialect (`Rank` TEXT, `No.` TEXT, `T Score` TEXT, `Int` TEXT, name TEXT)",
    "INSERT INTO dialect VALUES ('23', '42.', '7.5', '1', 'a'), ('5', '42', '1', '2', 'b'), ('x', 'abc', '0', '3', 'c'), "
    "('7', ' 7', '10', '4', 'd'), (NULL, NULL, NULL, '5', 'e')",
]
# Each answers the same on MariaDB and (translated) on SQLite. Before translate, SQLite answered
# every SELECT here differently (the writes show in the SELECT after them).
SAME_ANSWER = [
    # text compared with a number compares as numbers
    "SELECT name FROM dialect WHERE `No.` = 42 ORDER BY name",
    "SELECT name FROM dialect WHERE 42 = dialect.`No.` ORDER BY name",
    "SELECT name FROM dialect WHERE `T Score` > 5 ORDER BY name",
    "SELECT name FROM dialect WHERE `No.` IN (42, 7) ORDER BY name",
    "SELECT name FROM dialect WHERE `T Score` BETWEEN 5 AND 50 ORDER BY name",
    "SELECT COUNT(*) FROM dialect WHERE `No.` = 0",
    # decimals stored into text columns keep MySQL's text
    "UPDATE dialect SET `T Score` = 7.500 WHERE name = 'a'",
    "INSERT INTO dialect (name, `T Score`) VALUES ('f', 1.50), ('g', .5), ('h', -0.250), ('i', 007.10)",
    "SELECT name, `T Score` FROM dialect ORDER BY name",
    # names that start with a digit
    "CREATE TABLE 1952_British_Grand_Prix_0 (Driver TEXT)",
    "INSERT INTO 1952_British_Grand_Prix_0 VALUES ('Farina')",
    "SELECT * FROM 1952_British_Grand_Prix_0",
]
# Reserved on MariaDB and MySQL 8 alike: a syntax error on both (SQLite ran them before).
BOTH_REFUSE = ["SELECT Int FROM dialect", "UPDATE dialect SET Int = 9 WHERE name = 'a'"]
# Reserved since MySQL 8.0 (upstream's server) only: MariaDB 10.11 runs it, MySQL 8 and now SQLite refuse.
MYSQL8_REFUSES = "UPDATE dialect SET `T Score` = 0 WHERE Rank = 23"


def _sql(query):
    return assistant_tool_call("execute_sql", {"query": query})


async def _answers(config, statements):
    env = DBEnvironment(config)
    session = await env.open("std", 0)
    try:
        await session.start()
        out = []
        for query in SETUP + statements:
            out.append((await session.step(_sql(query))).messages[0]["content"])
        return out[len(SETUP):]
    finally:
        await session.close()
        await env.aclose()


def _is_error(text):
    return text.startswith(("1064 (42000)", "SQLite execution error"))


@pytest.mark.mariadb
def test_sqlite_answers_as_mariadb(mysql_config):
    statements = SAME_ANSWER + BOTH_REFUSE + [MYSQL8_REFUSES, "SELECT name FROM dialect WHERE `T Score` = 0 ORDER BY name"]
    maria = anyio.run(_answers, attrs.evolve(mysql_config, max_rounds=40), statements)
    lite = anyio.run(_answers, DBConfig(max_rounds=40), statements)
    n = len(SAME_ANSWER)
    assert lite[:n] == maria[:n]
    assert maria[2] == "[('a',), ('d',)]"  # '10' > 5 as numbers; as text SQLite found only 'a'
    assert all(_is_error(m) and _is_error(s) for m, s in zip(maria[n:n + 2], lite[n:n + 2])), (maria, lite)
    # MariaDB runs the MySQL 8 error; SQLite answers as upstream's MySQL 8 did, and the row is unchanged.
    assert not _is_error(maria[n + 2])
    assert lite[n + 2] == ("1064 (42000): You have an error in your SQL syntax; check the manual that corresponds to "
                           "your MySQL server version for the right syntax to use near 'Rank = 23' at line 1")
    assert lite[n + 3] == "[('c',)]" and maria[n + 3] == "[('a',), ('c',)]"


def test_translate_by_hand():
    assert translate("UPDATE t SET `T Score` = 7.500 WHERE `No.` = 42") == (
        "UPDATE t SET `T Score` = '7.500' WHERE mysql_num(`No.`) = 42")
    assert translate("INSERT INTO 1952_x VALUES (-0.250, 007.10, 1e3, 3/2)") == (
        "INSERT INTO `1952_x` VALUES ('-0.250', '7.10', 1e3, 3/2)")
    assert translate("SELECT 0x1F, 1e5, t.a FROM t WHERE f(a) = 1 AND v = 'a' AND 5 < t.y") == (
        "SELECT 0x1F, 1e5, t.a FROM t WHERE f(a) = 1 AND v = 'a' AND 5 < mysql_num(t.y)")
    # Reserved words where MySQL 8 takes them: a function, a qualified name, a type.
    for fine in ("SELECT RANK() OVER (ORDER BY a) AS r FROM t", "SELECT t.Rank FROM t",
                 "SELECT CAST(a AS INT) FROM t", "CREATE TABLE x (a INT, b DEC(5,2))", "SELECT `Rank` FROM t"):
        assert translate(fine) == fine
    with pytest.raises(MySQLSyntaxError, match=r"near 'Rank FROM t' at line 2$"):
        translate("SELECT a,\n Rank FROM t")
    with pytest.raises(MySQLSyntaxError, match=r"near 'rank FROM t' at line 1$"):
        translate("SELECT a AS rank FROM t")
    assert translate("PRAGMA max_page_count = 100") == "PRAGMA max_page_count = 100"  # not a query


@pytest.mark.parametrize(("value", "number"), [
    ("42.", 42.0), (" 7.500", 7.5), ("abc", 0.0), ("12abc", 12.0), ("-1e2x", -100.0), (".5", 0.5), (None, None), (3, 3),
])
def test_mysql_num_reads_a_prefix_as_mysql(value, number):
    assert mysql_num(value) == number
