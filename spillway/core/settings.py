"""Configuration from the environment, with the names and defaults of the system spillway came
from (docs/design.md, "What spillway is and where it came from").

The worker and every CLI command read the same model, so a threshold means the same thing
everywhere. Keys are SecretStr: they print as '**********' and only the activity that calls the
provider ever unwraps them.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
import secrets
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AliasChoices,
    AnyHttpUrl,
    BaseModel,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from spillway.core.addresses import allow_list
from spillway.core.errors import ConfigError
from spillway.core.models import Thresholds

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout (or image) above spillway/core/

# An approval secret anyone could guess would let anyone approve spending.
MIN_APPROVAL_SECRET = 16

Percent = Annotated[float, Field(gt=0, le=100)]
Seconds = Annotated[float, Field(gt=0)]


def _user_info_encoded(value: object) -> object:
    if isinstance(value, str) and unencoded_user_info(value):
        # Never the value: its user-info is a password, and where it ends is the question.
        raise ValueError(
            "its user-info (before the @) holds an unencoded /, ?, #, [, ] or @: "
            "percent-encode them (/ as %2F, @ as %40)"
        )
    return value


# A URL whose user-info every client splits the same way (`unencoded_user_info`).
CheckedUrl = Annotated[AnyHttpUrl, BeforeValidator(_user_info_encoded)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True)

    COMFYUI_URL: CheckedUrl = AnyHttpUrl("http://127.0.0.1:8188")
    # Base URL of the host that serves /api/burst/a40-guard/status; unset = source skipped.
    A40_GUARD_URL: CheckedUrl | None = None
    A40_VRAM_BUSY_PCT: Percent = 85.0
    A40_UTIL_BUSY_PCT: Percent = 95.0
    A40_NVML_INDEX: Annotated[int, Field(ge=0)] = 0
    LOAD_PROBE_TIMEOUT_S: Annotated[float, Field(gt=0, le=60)] = 2.0
    UNREACHABLE_CONFIRM_S: Seconds = 5.0
    # A job that found ComfyUI unreachable and got no approval waits this long for it to return.
    UNREACHABLE_GIVE_UP_S: Seconds = 86400.0
    # A host silent this long under a running job is lost: an armed job moves to the cloud. Longer
    # than a routine ComfyUI restart, which must not send every job on the card to the cloud.
    HOST_LOST_AFTER_S: Seconds = 60.0
    COMFYUI_HISTORY_POLL_S: Seconds = 5.0
    # How long one ComfyUI request may go without its answer, and a download without a byte: a
    # host silent that long (a power cut, a partition) is an unanswered call, retried or counted
    # towards HOST_LOST_AFTER_S.
    COMFYUI_REQUEST_TIMEOUT_S: Seconds = 30.0
    COMFYUI_DOWNLOAD_TIMEOUT_S: Seconds = 60.0
    # What a host can run (GET /object_info: its node classes, model files and other list
    # options) is read again when this old: a custom node or a model installed is seen within it.
    COMFYUI_CAPABILITIES_REFRESH_S: Annotated[float, Field(ge=1, le=86400)] = 300.0
    # A local render with no progress for this long (no new node, no sampler step) is stopped:
    # its prompt interrupted, then one more local try, or the cloud if armed; a second stall
    # fails the job. Generous, since a VAE decode of a long clip can be silent for minutes; per
    # host `render_stall_s` in routing_tiers.json. 0: never.
    RENDER_STALL_S: Annotated[float, Field(ge=0, le=7 * 86400)] = 900.0
    # A job's patience when it names none (`submit --max-wait`): an armed job whose GPU hosts
    # are full waits in the line while the line's estimate is within it, and overflows to the
    # cloud once the estimate or its wait passes it. 0: overflow as soon as the places are full.
    CLOUD_OVERFLOW_AFTER_S: Annotated[float, Field(ge=0, le=7 * 86400)] = 0.0
    COMFYUI_MAX_ATTEMPTS: Annotated[int, Field(ge=1, le=10)] = 3  # submits per job, LOST included

    CLOUD_VIDEO_FALLBACK_ENABLED: bool = False
    MINIMAX_API_KEY: SecretStr | None = None
    MINIMAX_BASE_URL: CheckedUrl = AnyHttpUrl("https://api.minimax.io")
    MINIMAX_POLL_INTERVAL_S: Seconds = 10.0
    # No answer to a create within this is ambiguous (a charge may exist): never retried.
    MINIMAX_CREATE_TIMEOUT_S: Annotated[float, Field(gt=0, le=60)] = 60.0

    # Caps on cloud spending per UTC day / month (the estimates in routing_tiers.json); unset =
    # no cap of that kind. Only `spillway approve --over-budget` goes past them.
    CLOUD_DAILY_BUDGET_USD: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    CLOUD_MONTHLY_BUDGET_USD: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None

    # Kling, the second cloud provider (docs/design.md, "Kling facts"): both keys or none.
    KLING_ACCESS_KEY: SecretStr | None = None
    KLING_SECRET_KEY: SecretStr | None = None
    KLING_BASE_URL: CheckedUrl = AnyHttpUrl("https://api-singapore.klingai.com")
    KLING_MODEL: Annotated[str, Field(min_length=1)] = "kling-v2-6"
    KLING_MODE: Literal["std", "pro"] = "std"
    KLING_POLL_INTERVAL_S: Seconds = 10.0
    # No answer to a create within this is unclear: Kling is then asked by the create's own id.
    KLING_CREATE_TIMEOUT_S: Annotated[float, Field(gt=0, le=60)] = 30.0
    # The order cloud providers are tried in (activities/cloud/registry.py knows their names);
    # only those with keys on the worker count.
    CLOUD_PROVIDERS: Annotated[str, Field(pattern=r"^\s*[a-z0-9_]+(\s*,\s*[a-z0-9_]+)*\s*$")] = (
        "minimax,kling"
    )

    APPROVAL_TIMEOUT_S: Seconds = 900.0
    # Runs of 0.4.0 only: a job waiting for approval re-probed this often. The GPU pool re-probes
    # the hosts instead, every SPILLWAY_POOL_REPROBE_S while jobs wait.
    APPROVAL_RECHECK_S: Seconds = 60.0
    SPILLWAY_POOL_REPROBE_S: Annotated[float, Field(ge=0.5, le=300)] = 2.0
    # A job waiting in the GPU line asks the pool again this often, unanswered unless the pool
    # lost it: a pool that was terminated is started again by it, and takes back the whole line.
    SPILLWAY_POOL_LINE_CHECK_S: Annotated[float, Field(ge=1, le=3600)] = 300.0
    # A job whose ask the GPU pool has not answered this long asks again (by the activity that
    # also finds a pool running where no spillway worker polls, and ends it). Not sooner: under a
    # burst of thousands, asks sent again would only lengthen the pool's work.
    SPILLWAY_POOL_ASK_AGAIN_S: Annotated[float, Field(ge=1, le=3600)] = 120.0
    # A job holding a GPU place not heard from this long is asked whether it still holds it
    # (checked again every half of it): a place whose job was terminated is free within 1.5 times
    # this, once its prompt is out of ComfyUI.
    SPILLWAY_POOL_HOLDER_CHECK_S: Annotated[float, Field(ge=2, le=3600)] = 60.0
    # The GPU pool's answers (signals to the jobs) whose completion has not come back, at most;
    # the rest wait their turn in order. Temporal fails the pool's workflow task once it has 2,000
    # signals to other workflows pending (limit.numPendingSignals.error), and a line of
    # thousands is answered at once.
    SPILLWAY_POOL_SIGNALS_IN_FLIGHT: Annotated[int, Field(ge=1)] = 500
    # Aging in the GPU line: a waiting job's priority rises one step for every this many seconds
    # it has waited, so a job is passed only by jobs that asked less than (its priority - theirs)
    # times this after it, and a stream of urgent jobs never starves the rest. 0: strict priority.
    SPILLWAY_POOL_AGING_S: Annotated[float, Field(ge=0, le=7 * 86400)] = 600.0
    # A free place goes to a job whose graph's model files its host loaded last (warm), before
    # a host where they are not; and such a job in line may take a freed place ahead of jobs of
    # its own priority whose models are not warm there, each passed at most twice.
    SPILLWAY_POOL_PREFER_WARM: bool = True
    # Preemption (opt-in): `priority`, a job waiting for a place may take the place of a running
    # job at least two priority steps lower; `fair`, that, and a team below its share may take
    # one of a team above its share. The victim's prompt is taken out of ComfyUI first, and it
    # waits in line again at its first ask time.
    SPILLWAY_PREEMPT: Literal["off", "priority", "fair"] = "off"
    # Never preempted: a job that has held its place longer than this (most of its render would
    # be lost).
    SPILLWAY_PREEMPT_MAX_RUN_S: Annotated[float, Field(ge=0, le=7 * 86400)] = 120.0
    # Places of the single GPU host (routing_tiers.json's `max_jobs` per host otherwise): one
    # rendering, one ready behind it so the card never idles between two jobs.
    A40_MAX_JOBS: Annotated[int, Field(ge=1, le=1000)] = 2
    APPROVAL_WEBHOOK_URL: CheckedUrl | None = None
    # Set on the workers and on the approvers' machines: only decisions signed with it are used
    # (spillway/core/approvals.py), so signalling the namespace no longer approves spending. Unset:
    # anyone who can signal the namespace can approve.
    SPILLWAY_APPROVAL_SECRET: SecretStr | None = None
    # Set on the workers and where `spillway ledger restore` runs: a spend ledger then grants
    # only on input spillway made (spillway/core/ledger_seal.py), so starting one is no longer
    # enough to spend. Unset: any start of the ledger on spillway's queue is believed.
    SPILLWAY_LEDGER_SECRET: SecretStr | None = None
    # A waiting job continues as new after this many wake-ups (signals it was sent; re-probes of
    # a job started by 0.4.0, ~11 history events each).
    SPILLWAY_AWAIT_LOOPS_PER_RUN: Annotated[int, Field(ge=1)] = 200

    # Set by `spillway dev --simulate` for its worker: a job decided there carries it, and a
    # create refuses to run on a worker of the other kind (a simulated job never meets a key).
    SPILLWAY_SIMULATED: bool = False
    SPILLWAY_OUTPUT_DIR: Path = Path("outputs")
    # s3://BUCKET[/PREFIX]: outputs (and inputs) stored there, with the standard AWS_*
    # variables; unset: the local folder SPILLWAY_OUTPUT_DIR on the host that downloaded them.
    SPILLWAY_OUTPUT_URL: Annotated[str, Field(pattern=r"^s3://[^/\s]+(/\S*)?$")] | None = None
    AWS_ACCESS_KEY_ID: SecretStr | None = None  # unset: botocore's own chain (profile, role)
    AWS_SECRET_ACCESS_KEY: SecretStr | None = None
    AWS_SESSION_TOKEN: SecretStr | None = None
    AWS_REGION: str | None = Field(
        None, validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION")
    )
    AWS_ENDPOINT_URL: CheckedUrl | None = None  # MinIO / R2 / SeaweedFS: path-style addressing
    # Where every job's completion events go unless it named its own (submit --callback-url);
    # a Slack or Mattermost URL is a credential. The secret signs deliveries to it only
    # (webhook_key below), never to a URL a client chose.
    JOB_WEBHOOK_URL: SecretStr | None = None
    JOB_WEBHOOK_SECRET: SecretStr | None = None
    # Hosts a client's input URL or callback URL may name although they are (or resolve to)
    # loopback, private or link-local addresses: the studio's own file server. Comma-separated.
    SPILLWAY_INPUT_ALLOW_HOSTS: str = ""
    SPILLWAY_TASK_QUEUE: Annotated[str, Field(min_length=1)] = "spillway"
    SPILLWAY_ROUTING_TIERS: Path = PROJECT_ROOT / "routing_tiers.json"
    # The teams (docs/design.md, "A studio of several teams"); unset: one team, `studio`.
    SPILLWAY_TEAMS_FILE: Path | None = None
    # Long activities heartbeat 6 times per timeout; a dead worker's work moves on after it.
    SPILLWAY_HEARTBEAT_TIMEOUT_S: Annotated[float, Field(ge=1, le=30)] = 30.0
    # On SIGTERM a create in flight must be allowed to end (it is never aborted once sent);
    # longer than the longest create (LONGEST_CREATE_S). Waits hand over to another worker.
    SPILLWAY_SHUTDOWN_GRACE_S: Annotated[float, Field(ge=0)] = 330.0
    SPILLWAY_METRICS_PORT: Annotated[int, Field(ge=1, le=65535)] | None = None  # unset: off
    # Jobs one worker or agent follows at once while they wait (on ComfyUI, on MiniMax) or
    # download: a slot pool apart from probes, decisions and creates, so those never starve.
    SPILLWAY_MAX_WAITS: Annotated[int, Field(ge=1)] = 2000
    # Job workflows a worker keeps in memory between their tasks. Sized for the line: a waiting
    # job evicted from a full cache replays its history at each of its timers and answers and
    # leaves garbage for a full collection, so with 2,000 in line a cache of 1,000 (the SDK's)
    # held twice the memory of one for all and cost the server six times the CPU
    # (bench/admission.py, docs/performance.md "The cache sized for the line").
    SPILLWAY_MAX_CACHED_WORKFLOWS: Annotated[int, Field(ge=0)] = 4000
    SPILLWAY_UI_URL: CheckedUrl = AnyHttpUrl("http://localhost:8233")  # links in notifications
    # `spillway console`: whether its page and GET API answer people who have not signed in.
    # Unset: open while it listens on 127.0.0.1 only (whoever reaches it is on this machine),
    # closed on any other address. Acting always needs a signed-in person.
    SPILLWAY_CONSOLE_OPEN_READ: bool | None = None

    @field_validator("JOB_WEBHOOK_URL")
    @classmethod
    def _http_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @field_validator("JOB_WEBHOOK_SECRET")
    @classmethod
    def _usable_webhook_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            webhook_key(value.get_secret_value())  # a malformed whsec_ fails here, not per event
        return value

    @field_validator("SPILLWAY_APPROVAL_SECRET", "SPILLWAY_LEDGER_SECRET")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_APPROVAL_SECRET:
            raise ValueError(
                f"must be at least {MIN_APPROVAL_SECRET} characters (make one with "
                "`openssl rand -hex 32`)"
            )
        return value

    @model_validator(mode="after")
    def _kling_needs_both_keys(self) -> Self:
        if (self.KLING_ACCESS_KEY is None) != (self.KLING_SECRET_KEY is None):
            raise ValueError("KLING_ACCESS_KEY and KLING_SECRET_KEY go together: set both or none")
        return self

    @field_validator(
        "A40_GUARD_URL",
        "APPROVAL_WEBHOOK_URL",
        "MINIMAX_API_KEY",
        "KLING_ACCESS_KEY",
        "KLING_SECRET_KEY",
        "SPILLWAY_OUTPUT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "JOB_WEBHOOK_URL",
        "JOB_WEBHOOK_SECRET",
        "SPILLWAY_APPROVAL_SECRET",
        "SPILLWAY_LEDGER_SECRET",
        "SPILLWAY_METRICS_PORT",
        "SPILLWAY_TEAMS_FILE",
        "CLOUD_DAILY_BUDGET_USD",
        "CLOUD_MONTHLY_BUDGET_USD",
        "SPILLWAY_CONSOLE_OPEN_READ",
        mode="before",
    )
    @classmethod
    def _empty_means_unset(cls, value: object) -> object:
        # `A40_GUARD_URL=` in a compose file or shell means "not configured", not "invalid URL".
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(
            vram_busy_pct=self.A40_VRAM_BUSY_PCT, util_busy_pct=self.A40_UTIL_BUSY_PCT
        )

    @property
    def input_allow_hosts(self) -> frozenset[str]:
        return allow_list(self.SPILLWAY_INPUT_ALLOW_HOSTS)

    def comfyui(self, path: str) -> str:
        return str(self.COMFYUI_URL).rstrip("/") + path

    def guard_status_url(self) -> str | None:
        if self.A40_GUARD_URL is None:
            return None
        return str(self.A40_GUARD_URL).rstrip("/") + "/api/burst/a40-guard/status"


WHSEC_PREFIX = "whsec_"


def webhook_key(secret: str) -> bytes:
    """The HMAC key of JOB_WEBHOOK_SECRET. `whsec_<base64>` is the Standard Webhooks form, which
    receivers' libraries decode the same way; any other value is raw text, keyed as its UTF-8
    bytes. The error never quotes the value: it is the secret."""
    if not secret.startswith(WHSEC_PREFIX):
        return secret.encode()
    encoded = secret.removeprefix(WHSEC_PREFIX)
    try:
        # The spec's libraries accept it unpadded, so padding is optional here too.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        key = b""
    if not key:
        raise ValueError(
            "a secret starting with whsec_ must be base64 after the prefix (make one with "
            "`echo whsec_$(openssl rand -base64 32)`); a secret without the prefix is used as "
            "raw text"
        )
    return key


# A field whose name holds one of these never has its value shown (a webhook URL is a credential;
# a storage URL may carry credentials, e.g. https://KEY:SECRET@host).
SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "WEBHOOK", "PASSWORD", "CALLBACK", "OUTPUT_URL", "AWS_")


_Model = TypeVar("_Model", bound=BaseModel)


def read_config_file(path: Path, model: type[_Model], what: str) -> _Model:
    """A JSON configuration file (the routing tiers, the teams): ConfigError in one line, naming
    the file and each bad field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"{what} {path}")) from None


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One line naming each bad field and what is wrong with it, never the value of a secret."""
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or source
        got = ""
        secret = any(word in field.upper() for word in SECRET_WORDS)
        value = err.get("input")
        if not secret and isinstance(value, str | int | float):
            # A URL's user-info is a password: `http://ops:hunter2@host` shows as `http://host`.
            value = shown(value) if isinstance(value, str) and "@" in value else value
            got = f" (got {_clip(repr(value))})"
        parts.append(f"{field}: {err['msg']}{got}")
    return f"invalid {source}: " + "; ".join(parts)


def _after_user_info(url: str) -> tuple[str, str | None]:
    """(the URL without its user-info, the user-info or None). The user-info runs to the last
    `@` before the query, not to the first `/`: in `http://ops:2024/Secret@comfy:8188` a
    password with an unencoded `/` would otherwise read as a host, a port and a path."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None
    user_info, at, _ = re.split(r"[?#]", rest, maxsplit=1)[0].rpartition("@")
    if not at:
        return url, None
    return f"{scheme}://{rest[len(user_info) + 1 :]}", user_info


USER_INFO_RESERVED = set("/?#[]@")


def unencoded_user_info(url: str) -> bool:
    """A user-info with a reserved character left unencoded: clients split such a URL in
    different places (a password taken for a host, or shown in a path)."""
    _, user_info = _after_user_info(url)
    return user_info is not None and bool(USER_INFO_RESERVED & set(user_info))


def shown(url: object) -> str:
    """A URL as any text may show it (errors, logs, history, webhooks, `health`): without
    user-info (`http://ops:password@host`) or query (a signature, a token)."""
    try:
        parts = urlsplit(_after_user_info(str(url))[0])
        port = parts.port
    except ValueError:
        return "<a URL that is not well formed>"
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


DEFAULT_PORTS = {"http": 80, "https": 443}


def url_key(url: object) -> str:
    """A URL as two spellings of one address compare equal (`HTTP://GPU:80/` and `http://gpu`):
    scheme and host in lower case, the port written out, no trailing slash; and, as `shown`
    writes it, without user-info or query, which any text may show."""
    try:
        parts = urlsplit(_after_user_info(str(url))[0])
        port = parts.port
    except ValueError:
        return shown(url)
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = port if port is not None else DEFAULT_PORTS.get(scheme)
    netloc = host if port is None else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def is_loopback(url: object) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1: the machine of whoever reads the URL."""
    try:
        host = urlsplit(str(url)).hostname or ""
    except ValueError:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Settings a file may hold instead of the environment: one file per setting, named after it, in
# the folder SPILLWAY_SECRETS_DIR names (a volume `spillway init` fills in the compose stack; it
# makes the folder too). A value in the environment wins; an empty one (`SPILLWAY_LEDGER_SECRET=`
# in .env) does not.
SECRET_FILES = ("SPILLWAY_LEDGER_SECRET", "SPILLWAY_APPROVAL_SECRET")


def secrets_dir() -> Path | None:
    folder = os.environ.get("SPILLWAY_SECRETS_DIR", "")
    return Path(folder) if folder else None


def load_settings() -> Settings:
    try:
        return Settings(**_from_secret_files())
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "environment setting")) from None


def make_secret_file(folder: Path, name: str) -> tuple[str, bool]:
    """The secret in `folder/name`, made (32 random bytes as hex, readable by its owner only)
    when there is none yet; and whether it was made now."""
    path = folder / name
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            value = secrets.token_hex(32)
            out.write(value + "\n")
            return value, True
    except FileExistsError:
        return path.read_text().strip(), False


def _from_secret_files() -> dict[str, Any]:
    folder = secrets_dir()
    if folder is None:
        return {}
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"SPILLWAY_SECRETS_DIR={folder} is not a folder")
    found = {}
    for name in SECRET_FILES:
        path = folder / name
        if not os.environ.get(name) and path.is_file():
            try:
                found[name] = path.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    return found
