"""What spillway sends to Kling, built without I/O: a job's CloudRequest mapped onto Kling's
request body, the routing_tiers.json key of its planning figure, the request bodies themselves,
and the JWT (docs/design.md, "Kling facts")."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from typing import Any

import pytest

from activities.comfyui.models import of_another_run, of_run, prompt_id_for
from activities.kling.requests import (
    JWT_BAD_SIGNATURE,
    JWT_EXPIRED,
    JWT_MALFORMED,
    JWT_NOT_YET_VALID,
    JWT_WRONG_ISSUER,
    cost_key,
    create_body,
    create_request,
    external_task_id,
    external_task_ids,
    sign_jwt,
    verify_jwt,
)
from spillway.core.models import CloudRequest
from spillway.core.names import run_tag
from spillway.core.settings import PROJECT_ROOT
from spillway.core.tiers import load_tiers

PROMPT = "a heron lifting off over a spillway at dawn"

# --- a job's request, as Kling reads it ---------------------------------------------------------


@pytest.mark.parametrize(
    ("duration", "resolution", "kling_duration"),
    [(6, "768P", "5"), (6, "1080P", "5"), (10, "768P", "10")],
    ids=["minimax_6s_is_5s", "1080P_6s_is_5s", "10s_is_10s"],
)
def test_minimax_length_maps_to_the_nearest_kling_length_and_its_cost_key(
    duration, resolution, kling_duration
):
    request = CloudRequest(prompt=PROMPT, duration=duration, resolution=resolution)

    kind, body = create_request(
        request, external_task_id="spillway-job-1-0123abcd", model="kling-v2-6", mode="std"
    )

    assert (kind, body["duration"]) == ("text2video", kling_duration)
    assert cost_key(request, "std") == f"std/{kling_duration}s"
    assert cost_key(request, "pro") == f"pro/{kling_duration}s"


def test_text_request_becomes_text2video_in_16_9_with_the_settings_model_and_mode():
    kind, body = create_request(
        CloudRequest(prompt=PROMPT),
        external_task_id="spillway-job-1-0123abcd",
        model="kling-v2-5-turbo",
        mode="pro",
    )

    assert kind == "text2video"
    assert body == {
        "model_name": "kling-v2-5-turbo",
        "prompt": PROMPT,
        "aspect_ratio": "16:9",
        "mode": "pro",
        "duration": "5",
        "external_task_id": "spillway-job-1-0123abcd",
    }


def test_request_with_a_first_frame_becomes_image2video_with_bare_base64():
    request = CloudRequest(prompt=PROMPT, first_frame_image="data:image/jpeg;base64,/9j/4AAQ")

    kind, body = create_request(request, external_task_id="x-1", model="kling-v2-6", mode="std")

    assert kind == "image2video"
    assert body["image"] == "/9j/4AAQ" and body["prompt"] == PROMPT
    assert "aspect_ratio" not in body  # the video takes the image's shape


def test_an_image_kling_cannot_read_is_refused_before_anything_is_sent():
    request = CloudRequest(prompt=PROMPT, first_frame_image="data:image/webp;base64,UklGRg==")

    with pytest.raises(ValueError, match="JPG or PNG"):
        create_request(request, external_task_id="x-1", model="kling-v2-6", mode="std")


def test_external_task_id_is_fixed_per_job_and_run():
    run = "7c1e4a52-93d0-4c1f-9a55-2f0e3b9d1a77"
    assert re.fullmatch(r"spillway-job-1-[0-9a-f]{16}", external_task_id("job-1", run))
    assert external_task_id("job-1", run) == external_task_id("job-1", run)
    assert external_task_id("job-1", "0f" + run[2:]) != external_task_id("job-1", run)


def test_runs_a_second_apart_get_different_ids():
    # UUIDv7 run ids of runs started one second apart share their first 8 characters.
    first, second = "01a23503-1f00-7abc-8def-0123456789ab", "01a23503-22e8-7abc-8def-fedcba987654"
    assert first[:8] == second[:8]
    assert external_task_id("tour-1", first) != external_task_id("tour-1", second)
    assert prompt_id_for("tour-1", 1, run_tag(first)) != prompt_id_for("tour-1", 1, run_tag(second))
    # A create sent by 0.2.0 is still found by the id it carried.
    assert external_task_ids("tour-1", first)[1] == "spillway-tour-1-01a23503"


def test_a_prompt_id_tells_the_job_s_other_runs_and_never_claims_another_job_s():
    mine = prompt_id_for("a", 2, run_tag("run-b"))
    earlier = prompt_id_for("a", 1, run_tag("run-a"))
    assert of_another_run(earlier, mine) and not of_run(earlier, mine)
    assert of_run(prompt_id_for("a", 1, run_tag("run-b")), mine)
    assert of_another_run("spillway-a-01a23503-1", mine)  # a run of 0.2.0 (8 characters)
    assert not of_another_run(mine, mine)
    # Job "a-b" (and its run tags) is not job "a", however its id is cut.
    for other in (prompt_id_for("a-b", 1, run_tag("run-a")), "spillway-a-b-01a23503-1"):
        assert not of_another_run(other, mine) and not of_run(other, mine)


# --- request bodies ------------------------------------------------------------------------------


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


def test_tokens_follow_rfc_7519_hs256_as_any_jwt_library_computes_it():
    """Header, claims and signature computed here independently (RFC 7515 base64url without
    padding, HMAC-SHA256 over "header.claims"): what spillway signs is what any library signs,
    and what any library signs spillway accepts. No token is written down in this file."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    def token(claims: dict[str, object], secret: str) -> str:
        head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
        body = b64(json.dumps(claims, separators=(",", ":")).encode())
        mac = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{b64(mac)}"

    ours = sign_jwt(ACCESS, SECRET, NOW)
    head, body, _ = ours.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))["alg"] == "HS256"
    assert token(claims, SECRET) == ours
    theirs = token({"iss": ACCESS, "exp": NOW + 60, "nbf": NOW - 5}, SECRET)
    assert verify_jwt(theirs, ACCESS, SECRET, NOW) is None
    assert verify_jwt(theirs, ACCESS, "not-the-secret", NOW) == JWT_BAD_SIGNATURE


@pytest.mark.parametrize("mode", ["std", "pro"])
@pytest.mark.parametrize("duration", [6, 10])
def test_every_kling_clip_has_a_planning_figure_in_the_committed_routing_tiers(mode, duration):
    tier = load_tiers(PROJECT_ROOT / "routing_tiers.json").by_provider("kling")
    assert tier is not None and tier.enabled
    key = cost_key(CloudRequest(prompt=PROMPT, duration=duration), mode)
    assert tier.estimated_cost_usd[key] > 0
