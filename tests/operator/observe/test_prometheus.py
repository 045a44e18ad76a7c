"""Instant queries against Prometheus' HTTP API (``/api/v1/query``, its documented JSON), for
plans that name a step-seconds query, served here by a local stand-in of the API."""

from __future__ import annotations

import pytest

from shardmeter_operator.observe import prometheus
from support.prometheus import fake_prometheus, vector


def test_one_sample_is_the_step_and_anything_else_says_what_came_back() -> None:
    query = prometheus.render(
        'avg(rate(step_seconds_sum{namespace="$namespace",pod="$pod"}[5m])) $unknown',
        namespace="team-a",
        pod="run-island-0-abcde",
        job="run-island-0",
        island="run-island-0",
    )
    assert (
        query
        == 'avg(rate(step_seconds_sum{namespace="team-a",pod="run-island-0-abcde"}[5m])) $unknown'
    )
    answers = {
        "one": (200, vector(1.25)),
        "scalar": (
            200,
            {"status": "success", "data": {"resultType": "scalar", "result": [0, "2.5"]}},
        ),
        "two": (200, vector(1.0, 2.0)),
        "none": (200, vector()),
        "zero": (200, vector(0.0)),
        "nan": (200, vector(float("nan"))),
        "matrix": (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
        "broken": (200, b"<html>"),
    }
    with fake_prometheus(answers) as (url, seen):
        assert prometheus.instant_value(url, "one") == 1.25
        assert prometheus.instant_value(url + "/", "scalar") == 2.5
        for query, message in [
            ("two", "2 series, 1 needed"),
            ("none", "0 series"),
            ("zero", "finite number > 0"),
            ("nan", "finite number > 0"),
            ("matrix", "returned a matrix"),
            ("broken", "not JSON"),
            ("bad(", "HTTP 400 .*parse error"),
        ]:
            with pytest.raises(prometheus.QueryError, match=message):
                prometheus.instant_value(url, query)
        assert seen[0] == "one"
    with pytest.raises(prometheus.QueryError, match="unreachable"):
        prometheus.instant_value("http://127.0.0.1:9", "one", timeout_s=2)
