"""Kling's answers read without I/O: every row of what a create proves (money invariant 2) and
how a query reads (docs/design.md, "Kling facts")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from activities.cloud.models import CreateOutcome
from activities.kling.answers import KlingTask, QueryProblem, classify_create, read_query


def answer(code: int, task_id: str | None = None, message: str = "") -> dict[str, Any]:
    data = None if task_id is None else {"task_id": task_id, "task_status": "submitted"}
    return {"code": code, "message": message, "request_id": "req-1", "data": data}


# (HTTP status, body) -> (outcome, task_id, rate_limited). Every code of docs/design.md's table, the
# documented codes it has not adopted, and the HTTP-level cases.
CREATE_ROWS: list[tuple[str, int | None, Any, CreateOutcome, str | None, bool]] = [
    ("ok with a task id", 200, answer(0, "866889456698785"), "created", "866889456698785", False),
    ("ok as raw bytes", 200, json.dumps(answer(0, "t-2")).encode(), "created", "t-2", False),
    ("ok without a task id", 200, answer(0, ""), "ambiguous", None, False),
    ("ok without data", 200, answer(0), "ambiguous", None, False),
    ("ok with HTTP 404", 404, answer(0, "t-3"), "ambiguous", "t-3", False),
    ("1000 authentication failed", 401, answer(1000), "refused", None, False),
    ("1001 Authorization empty", 401, answer(1001), "refused", None, False),
    ("1002 Authorization invalid", 401, answer(1002), "refused", None, False),
    ("1003 not yet valid", 401, answer(1003), "refused", None, False),
    ("1004 token expired: sign anew", 401, answer(1004), "retry", None, False),
    ("1100 account exception", 429, answer(1100), "refused", None, False),
    ("1101 account in arrears", 429, answer(1101), "refused", None, False),
    ("1102 resource pack used up", 429, answer(1102), "refused", None, False),
    ("1303 parallel task limit", 429, answer(1303), "retry", None, True),
    ("a refusal naming a task", 429, answer(1102, "t-4"), "ambiguous", "t-4", False),
    ("1201 not adopted: unknown", 400, answer(1201, message="duplicate"), "ambiguous", None, False),
    ("1302 not adopted: unknown", 429, answer(1302), "ambiguous", None, False),
    ("a code in no table", 200, answer(4242), "ambiguous", None, False),
    ("HTTP 500 with code 5000", 500, answer(5000), "ambiguous", None, False),
    ("HTTP 503 with code 1102", 503, answer(1102), "ambiguous", None, False),
    ("HTTP 502 HTML page", 502, "<html>502 Bad Gateway</html>", "ambiguous", None, False),
    ("truncated JSON", 200, '{"code": 0, "data": {"task_', "ambiguous", None, False),
    ("JSON that is not Kling's", 200, {"status": "ok"}, "ambiguous", None, False),
    ("a JSON list", 200, [answer(0, "t-5")], "ambiguous", None, False),
    ("no answer at all", None, None, "ambiguous", None, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("http_status", "body", "outcome", "task_id", "rate_limited"),
    [row[1:] for row in CREATE_ROWS],
    ids=[row[0] for row in CREATE_ROWS],
)
def test_create_answer_proves_exactly_what_its_row_says(
    http_status, body, outcome, task_id, rate_limited
):
    verdict = classify_create(http_status, body)
    assert (verdict.outcome, verdict.task_id, verdict.rate_limited) == (
        outcome,
        task_id,
        rate_limited,
    )


def test_create_verdict_carries_the_code_and_klings_own_words():
    verdict = classify_create(429, answer(1102, message="resource pack exhausted"))
    assert verdict.code == 1102
    assert "1102" in verdict.message and "resource pack exhausted" in verdict.message
    assert classify_create(502, "<html/>").message == "Kling answered HTTP 502"


def query_answer(status: str, **data: Any) -> dict[str, Any]:
    body = {"task_id": "t-1", "task_info": {"external_task_id": "job-1"}, "task_status": status}
    return {"code": 0, "message": "SUCCEED", "request_id": "r", "data": body | data}


def test_query_of_a_finished_task_reads_its_videos():
    result = {"videos": [{"id": "v-1", "url": "https://cdn.example/v-1.mp4", "duration": 5.042}]}
    task = read_query(200, query_answer("succeed", task_result=result))
    assert isinstance(task, KlingTask)
    assert (task.task_id, task.external_task_id, task.status) == ("t-1", "job-1", "succeed")
    assert task.video_urls == ["https://cdn.example/v-1.mp4"]
    assert task.videos[0].duration == "5.042"  # a string, as Kling sends it


def test_query_tolerates_missing_optional_fields():
    task = read_query(200, {"code": 0, "data": {"task_id": "t-9", "task_status": "processing"}})
    assert task == KlingTask(task_id="t-9", status="processing")
    assert task.video_urls == []


def test_failed_task_reads_klings_reason():
    task = read_query(200, query_answer("failed", task_status_msg="content safety triggered"))
    assert isinstance(task, KlingTask)
    assert (task.status, task.message) == ("failed", "content safety triggered")


@pytest.mark.parametrize(
    ("http_status", "body", "not_found", "retryable", "code"),
    [
        (404, answer(1203, message="task not found"), True, True, 1203),
        (401, answer(1002), False, False, 1002),
        (401, answer(1004), False, True, 1004),
        (429, answer(1303), False, True, 1303),
        (500, answer(5000), False, True, 5000),
        (200, query_answer("rendering"), False, True, None),
        (200, {"code": 0, "data": None}, False, True, 0),
        (502, "<html>bad gateway</html>", False, True, None),
        (None, None, False, True, None),
    ],
    ids=[
        "unknown task",
        "bad token",
        "expired token",
        "parallel limit",
        "server error",
        "unknown status",
        "ok without a task",
        "html",
        "no answer",
    ],
)
def test_query_problems_say_whether_asking_again_helps(
    http_status, body, not_found, retryable, code
):
    problem = read_query(http_status, body)
    assert isinstance(problem, QueryProblem)
    assert (problem.not_found, problem.retryable, problem.code) == (not_found, retryable, code)


@pytest.mark.parametrize(
    ("deduction", "units"),
    [("1.5", 1.5), (3, 3.0), (None, None), ("", None), ("n/a", None), ("-1", None), ("nan", None)],
)
def test_units_a_finished_task_used_are_read_when_kling_reports_them(deduction, units):
    # Resource-pack units, not money: what a unit costs depends on the pack the account bought.
    data = {} if deduction is None else {"final_unit_deduction": deduction}
    task = read_query(200, query_answer("succeed", **data))
    assert isinstance(task, KlingTask)
    assert task.units == units
