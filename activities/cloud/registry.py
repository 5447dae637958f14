"""The cloud providers spillway knows, by name: one `CloudProvider` each (activities/cloud/
provider.py says what that holds). Adding a provider is a folder of its own beside
activities/minimax/ and one entry here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from activities.cloud.provider import CloudProvider
from activities.kling.activities import PROVIDER as KLING
from activities.minimax.activities import PROVIDER as MINIMAX
from spillway.core.errors import ConfigError
from spillway.core.models import CloudRequest
from spillway.core.settings import Settings
from spillway.core.tiers import RoutingTiers

PROVIDERS: Mapping[str, CloudProvider] = MappingProxyType({p.name: p for p in (MINIMAX, KLING)})


def ordered(settings: Settings) -> list[CloudProvider]:
    """CLOUD_PROVIDERS in order; ConfigError naming a provider spillway does not know."""
    names = list(dict.fromkeys(p.strip() for p in settings.CLOUD_PROVIDERS.split(",")))
    unknown = [name for name in names if name not in PROVIDERS]
    if unknown:
        raise ConfigError(
            f"invalid environment setting: CLOUD_PROVIDERS: unknown provider "
            f"{', '.join(map(repr, unknown))}; known: {', '.join(PROVIDERS)}"
        )
    return [PROVIDERS[name] for name in names]


def check(settings: Settings, tiers: RoutingTiers) -> None:
    """ConfigError naming a cloud provider spillway does not know, in CLOUD_PROVIDERS or in a
    cloud tier of routing_tiers.json (a typo there would leave a job without an estimate)."""
    ordered(settings)
    for number, tier in enumerate(tiers.video_tiers):
        if tier.location == "cloud" and tier.provider not in PROVIDERS:
            raise ConfigError(
                f"invalid routing tiers {settings.SPILLWAY_ROUTING_TIERS}: video_tiers.{number}."
                f"provider: unknown cloud provider {tier.provider!r}; known: {', '.join(PROVIDERS)}"
            )


def check_ledger_secret(settings: Settings) -> None:
    """ConfigError for a worker that holds a provider's keys without SPILLWAY_LEDGER_SECRET: its
    spend ledger would believe any start on spillway's queue, so anyone who may start workflows
    could replace it with an empty one and spend the day's budget again."""
    holding = configured(settings)
    if holding and settings.SPILLWAY_LEDGER_SECRET is None:
        raise ConfigError(
            f"SPILLWAY_LEDGER_SECRET is not set, and this worker holds keys for "
            f"{', '.join(holding)}: without it anyone who may start workflows can replace the "
            "spend ledger and spend the budget again. Make one with `openssl rand -hex 32` and "
            "set it on every worker (and where `spillway ledger restore` runs), or set "
            "SPILLWAY_SECRETS_DIR and run `spillway init`, which makes one there"
        )


def configured(settings: Settings) -> list[str]:
    """The providers a job may go to, in CLOUD_PROVIDERS order: those whose keys this worker has."""
    return [p.name for p in ordered(settings) if p.keys_present(settings)]


def armed(settings: Settings) -> bool:
    """Armed for a job that has a cloud request (spillway.core.decision.is_armed): the switch and at
    least one provider's keys."""
    return settings.CLOUD_VIDEO_FALLBACK_ENABLED and bool(configured(settings))


def key_names() -> str:
    """What a worker needs for any cloud: "MINIMAX_API_KEY (or KLING_ACCESS_KEY and ...)"."""
    each = [" and ".join(p.key_names) for p in PROVIDERS.values()]
    return each[0] + "".join(f" (or {more})" for more in each[1:])


def label(name: str) -> str:
    provider = PROVIDERS.get(name)
    return provider.label if provider else name


def console(name: str) -> str:
    provider = PROVIDERS.get(name)
    return provider.console if provider else f"{name}'s console"


def cost_key(name: str, request: CloudRequest, settings: Settings) -> str:
    """The key of the clip's figure in routing_tiers.json for this provider ("" for a provider
    spillway does not know): what an approval is signed over and the ledger prices."""
    provider = PROVIDERS.get(name)
    return provider.cost_key(request, settings) if provider is not None else ""
