"""Reading PostgreSQL's plans in tests: whether a page's query is served by an index."""

import json

from django.db import connection


def sorts_whole(query: str) -> bool:
    """Whether the query's plan sorts its rows even where the planner may avoid it (plain
    sorts disabled for this transaction): a Sort node left is one no index can spare.
    An incremental sort (an index gives the order but for ties) is not one."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute(f"EXPLAIN (FORMAT JSON) {query}")
        (plan,) = cursor.fetchone()
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes = [plan[0]["Plan"]]
    while nodes:
        node = nodes.pop()
        if node["Node Type"] == "Sort":
            return True
        nodes += node.get("Plans", [])
    return False
