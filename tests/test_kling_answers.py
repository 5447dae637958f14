"""Kling's answers read without I/O: every row of what a create proves (money invariant 2), how
a query reads, the request bodies, and the JWT (DESIGN.md, "Kling facts")."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from spillway.cloud_models import CreateOutcome
from spillway.kling_answers import (
    JWT_BAD_SIGNATURE,
    JWT_EXPIRED,
    JWT_MALFORMED,
    JWT_NOT_YET_VALID,
    JWT_WRONG_ISSUER,
    KlingTask,
    QueryProblem,
    classify_create,
    create_body,
    read_query,
    sign_jwt,
    verify_jwt,
)


def answer(code: int, task_id: str | None = None, message: str = "") -> dict[str, Any]:
    data = None if task_id is None else {"task_id": task_id, "task_status": "submitted"}
    return {"code": code, "message": message, "request_id": "req-1", "data": data}


# (HTTP status, body) -> (outcome, task_id, rate_limited). Every code of DESIGN.md's table, the
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


def test_text2video_body_has_klings_field_names_and_a_string_duration():
    body = create_body(
        "text2video",
        external_task_id="job-1",
        prompt="a heron over a spillway",
        negative_prompt="blur",
        mode="pro",
        aspect_ratio="9:16",
        duration=10,
    )
    assert body == {
        "model_name": "kling-v2-6",
        "prompt": "a heron over a spillway",
        "aspect_ratio": "9:16",
        "negative_prompt": "blur",
        "mode": "pro",
        "duration": "10",
        "external_task_id": "job-1",
    }


def test_image2video_body_takes_bare_base64_and_no_aspect_ratio():
    body = create_body(
        "image2video",
        external_task_id="job-2",
        image="data:image/png;base64,iVBORw0KGgo=",
        image_tail="https://example.com/last.jpg",
    )
    assert body == {
        "model_name": "kling-v2-6",
        "image": "iVBORw0KGgo=",
        "image_tail": "https://example.com/last.jpg",
        "mode": "std",
        "duration": "5",
        "external_task_id": "job-2",
    }


@pytest.mark.parametrize(
    ("kind", "changes"),
    [
        ("text2video", {"external_task_id": " "}),
        ("text2video", {"prompt": "x" * 2501}),
        ("text2video", {"negative_prompt": "x" * 2501}),
        ("text2video", {"prompt": "   "}),
        ("text2video", {"duration": "6"}),
        ("text2video", {"mode": "fast"}),
        ("text2video", {"aspect_ratio": "4:3"}),
        ("text2video", {"image": "https://example.com/a.jpg"}),
        ("image2video", {"prompt": "no image"}),
    ],
)
def test_body_kling_would_refuse_is_never_built(kind, changes):
    values: dict[str, Any] = {"external_task_id": "job-3", "prompt": "a heron"} | changes
    with pytest.raises(ValueError):
        create_body(kind, **values)


# --- the JWT ----------------------------------------------------------------------------------

ACCESS, SECRET, NOW = "ak-test-0123", "sk-test-secret-4567", 1_760_000_000


def decode(part: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def test_jwt_has_klings_header_and_claims_in_unpadded_base64url():
    token = sign_jwt(ACCESS, SECRET, NOW)
    header, claims, signature = token.split(".")
    assert decode(header) == {"alg": "HS256", "typ": "JWT"}
    assert decode(claims) == {"iss": ACCESS, "exp": NOW + 1800, "nbf": NOW - 5}
    assert "=" not in token and "+" not in token and "/" not in token
    assert len(base64.urlsafe_b64decode(signature + "=")) == 32  # an HMAC-SHA256
    assert SECRET not in token


def test_jwt_is_valid_from_nbf_until_just_before_exp():
    token = sign_jwt(ACCESS, SECRET, NOW)
    assert verify_jwt(token, ACCESS, SECRET, NOW) is None
    assert verify_jwt(token, ACCESS, SECRET, NOW - 5) is None
    assert verify_jwt(token, ACCESS, SECRET, NOW + 1799) is None
    assert verify_jwt(token, ACCESS, SECRET, NOW + 1800) == JWT_EXPIRED
    assert verify_jwt(token, ACCESS, SECRET, NOW - 6) == JWT_NOT_YET_VALID


def test_jwt_with_wrong_secret_issuer_or_tampered_claims_is_refused():
    token = sign_jwt(ACCESS, SECRET, NOW)
    assert verify_jwt(token, ACCESS, "sk-another-secret", NOW) == JWT_BAD_SIGNATURE
    assert verify_jwt(token, "ak-another-account", SECRET, NOW) == JWT_WRONG_ISSUER
    header, _, signature = token.split(".")
    forged = base64.urlsafe_b64encode(
        json.dumps({"iss": ACCESS, "exp": NOW + 10**6, "nbf": 0}).encode()
    )
    tampered = f"{header}.{forged.decode().rstrip('=')}.{signature}"
    assert verify_jwt(tampered, ACCESS, SECRET, NOW) == JWT_BAD_SIGNATURE


@pytest.mark.parametrize("token", ["", "abc", "a.b", "a.b.c.d", "!!.??.**", "e30.e30.x"])
def test_malformed_token_is_refused(token):
    assert verify_jwt(token, ACCESS, SECRET, NOW) in (JWT_MALFORMED, JWT_BAD_SIGNATURE)


def test_signature_matches_the_published_hs256_example():
    # jwt.io's example token, signed with "your-256-bit-secret": the signature is accepted
    # (the claims then fail on the issuer), so tokens here interoperate with any JWT library.
    token = (
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
        "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
    )
    assert verify_jwt(token, ACCESS, "your-256-bit-secret", NOW) == JWT_WRONG_ISSUER
    assert verify_jwt(token, ACCESS, "not-the-secret", NOW) == JWT_BAD_SIGNATURE
    assert sign_jwt(ACCESS, SECRET, NOW).startswith("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.")
