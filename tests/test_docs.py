"""The guide stays true: every setting the code reads is in docs/configuration.md with the default
the code has, every relative link and anchor of README.md and docs/*.md resolves,
docs/layout.md names every module, every `spillway` command and option they show exists in the
parser, every `--json` key they name is in the published schema or a pinned shape, and the
callbacks' retry time is the policy's. Plain file reads: the fast lane."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import AnyUrl, BaseModel, SecretStr
from pydantic.fields import FieldInfo

from activities.callbacks import CALLBACK_RETRY
from spillway.cli.health import Health
from spillway.cli.parser import build_parser
from spillway.client.jobs import JobSummary
from spillway.client.ledger_restore import Restored
from spillway.client.teams import TeamRow
from spillway.core.ledger import LedgerSummary, MonthSpend, TeamSpend
from spillway.core.models import LoadStatus
from spillway.core.settings import PROJECT_ROOT, Settings

DOCS = PROJECT_ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
PAGES = [PROJECT_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# Where spillway reads the environment itself, besides the Settings class.
PACKAGES = ("spillway", "workflows", "activities")
CODE = [PROJECT_ROOT / "worker.py"] + [
    path for package in PACKAGES for path in sorted((PROJECT_ROOT / package).rglob("*.py"))
]
ENV_READ = re.compile(
    r"""os\.environ(?:\.get\(|\[)\s*["']([A-Z][A-Z0-9_]+)["']"""
    r"""|getenv\(\s*["']([A-Z][A-Z0-9_]+)["']"""
    r"""|["']([A-Z][A-Z0-9_]+)["']\s+(?:not\s+)?in\s+os\.environ"""
)
COMPOSE_READ = re.compile(r"\$\{([A-Z][A-Z0-9_]*)(?::-([^}]*))?\}")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def documented_settings() -> dict[str, str]:
    """`NAME` -> its default cell, from every table row of docs/configuration.md."""
    rows: dict[str, str] = {}
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) == 3:
            name = re.fullmatch(r"`([A-Z][A-Z0-9_]*)`", cells[0])
            if name:
                rows[name.group(1)] = cells[1]
    return rows


def written_default(field: FieldInfo) -> str | None:
    """The default as the page writes it: `85` for 85.0, `false` or `0` for False; None: unset."""
    value = field.default
    if value is None or value == "" or isinstance(value, SecretStr):
        return None
    if isinstance(value, bool):
        return "true|1" if value else "false|0"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, AnyUrl):
        return str(value).rstrip("/")
    if isinstance(value, Path):
        return value.name if value.is_absolute() else str(value)
    return str(value)


def default_is_written(cell: str, expected: str | None) -> bool:
    if expected is None:
        return cell.startswith("unset")
    return any(f"`{choice}`" in cell for choice in expected.split("|"))


UNKNOWN = "?"  # read where the code names no default (os.environ.get, `${X}` in compose)


def settings_read() -> dict[str, str | None]:
    """Every variable the code reads, with the default it has (None: unset; UNKNOWN: the read
    names none, only the row is checked)."""
    read: dict[str, str | None] = {}
    for name, field in Settings.model_fields.items():
        aliases = getattr(field.validation_alias, "choices", None) or [name]
        for alias in aliases:
            read[str(alias)] = written_default(field)
    for path in CODE:
        for match in ENV_READ.finditer(path.read_text(encoding="utf-8")):
            read.setdefault(next(g for g in match.groups() if g), UNKNOWN)
    compose = (PROJECT_ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    for name, default in COMPOSE_READ.findall(compose):
        read.setdefault(name, default or UNKNOWN)
    return read


def test_every_setting_the_code_reads_is_in_the_configuration_page_with_its_default():
    rows = documented_settings()
    read = settings_read()
    missing = sorted(set(read) - set(rows))
    assert not missing, f"docs/configuration.md lacks a row for: {', '.join(missing)}"
    wrong = [
        f"{name}: the code's default is {expected or 'unset'}, the page says {rows[name]}"
        for name, expected in sorted(read.items())
        if expected != UNKNOWN and not default_is_written(rows[name], expected)
    ]
    assert not wrong, "docs/configuration.md shows another default:\n" + "\n".join(wrong)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (hyphens, underscores and
    spaces kept), each space a hyphen."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def outside_code(text: str) -> str:
    """A page without its fenced code blocks, inline code blanked (a span may wrap lines)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return re.sub(r"`[^`]*`", "``", "\n".join(lines))


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (not the `# comments` of its code blocks); a heading's
    inline code counts for its slug, and a repeated heading gets -1, -2 as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(outside_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(PROJECT_ROOT)}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    return broken


def test_every_relative_link_and_anchor_of_the_readme_and_the_guide_resolves():
    broken = [
        f"{page.relative_to(PROJECT_ROOT)}: {b}" for page in PAGES for b in broken_links(page)
    ]
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)


def test_slugs_follow_githubs_rules():
    assert slug("Python: `spillway.client`") == "python-spillwayclient"
    assert slug("Is a GPU host busy? `spillway load`") == "is-a-gpu-host-busy-spillway-load"
    assert slug("The give-back with the download, and what the aims meet (2026-12-04)") == (
        "the-give-back-with-the-download-and-what-the-aims-meet-2026-12-04"
    )
    assert slug("SPILLWAY_POOL_AGING_S") == "spillway_pool_aging_s"


def test_the_layout_page_names_every_module():
    layout = (DOCS / "layout.md").read_text(encoding="utf-8")
    modules = [
        path.relative_to(PROJECT_ROOT).as_posix()
        for package in PACKAGES
        for path in sorted((PROJECT_ROOT / package).rglob("*.py"))
    ]
    missing = [module for module in modules if f"`{module}`" not in layout]
    assert not missing, f"docs/layout.md does not name: {', '.join(missing)}"


def test_the_callback_retry_time_the_guide_gives_is_the_policys():
    waits, wait = 0.0, CALLBACK_RETRY.initial_interval.total_seconds()
    cap = CALLBACK_RETRY.maximum_interval
    assert cap is not None
    for _ in range(CALLBACK_RETRY.maximum_attempts - 1):
        waits += min(wait, cap.total_seconds())
        wait *= CALLBACK_RETRY.backoff_coefficient
    minutes, seconds = divmod(int(waits), 60)
    said = f"{minutes} min {seconds} s"
    for page in ("clients.md", "design.md"):
        assert said in (DOCS / page).read_text(encoding="utf-8"), f"docs/{page} lacks {said}"


INLINE_COMMAND = re.compile(r"`(spillway [^`]+)`")


def shown_commands(text: str) -> Iterator[str]:
    """Every `spillway ...` a page shows: in inline code, and as a line of a fenced block (a
    `$ ` prompt and a trailing `# comment` left off)."""
    yield from INLINE_COMMAND.findall(text)
    fenced = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        command = line.strip().removeprefix("$ ").split(" #")[0]
        if fenced and command.startswith("spillway "):
            yield command


def _commands_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def not_in_the_parser(shown: str) -> str | None:
    """Why a command a page shows would not run as written (None: its words and options are the
        parser's). Placeholders (JOB, NAME) and values pass; `--day/--month` names two options,
    `approve|reject` two commands."""
    try:
        words = shlex.split(shown)
    except ValueError:  # an unclosed quote in prose: its words as they stand
        words = shown.split()
    parser, path = build_parser(), ["spillway"]
    for word in words[1:]:
        commands = _commands_of(parser)
        if not commands or word.startswith("-"):
            break
        either = word.split("|")  # `approve|reject`: each is a command
        missing = [w for w in either if w not in commands]
        if missing:
            return f"{' '.join(path)} has no command {missing[0]!r}" if word.islower() else None
        parser = commands[either[0]]
        path.append(word)
    options = {o for action in parser._actions for o in action.option_strings}
    unknown = [
        name
        for word in words[1:]
        if word.startswith("--")
        for name in word.split("=")[0].split("/")
        if name.startswith("--") and name.rstrip(",.;:)") not in options
    ]
    return f"{' '.join(path)} has no option {', '.join(unknown)}" if unknown else None


def test_every_command_and_option_the_guide_shows_exists_in_the_parser():
    found = [
        f"{page.name}: {shown}: {why}"
        for page in PAGES
        for shown in shown_commands(page.read_text(encoding="utf-8"))
        if (why := not_in_the_parser(shown)) is not None
    ]
    assert not found, "\n".join(found)
    assert not_in_the_parser("spillway cancel job-1 --by ana --frob") == (
        "spillway cancel has no option --frob"
    )
    assert not_in_the_parser("spillway frob job-1") == "spillway has no command 'frob'"
    assert not_in_the_parser("spillway budget --day/--month") is None


def test_the_screenshot_command_the_readme_gives_runs_as_written():
    """`scripts/ui_screenshot.py JOB ...` had no run bit and no shebang: the README's line could
    not run as it stood. It names the venv's Python, which has the script's `aiohttp`."""
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    shown = re.findall(r"`([^`]*scripts/ui_screenshot\.py[^`]*)`", readme)
    assert shown
    for line in shown:  # the Temporal UI's and the console's
        python, script, *_ = line.split()
        assert python == ".venv/bin/python" and (PROJECT_ROOT / script).is_file(), line


# The `--json` outputs that have no published schema, by the model each prints (`submit --json`
# prints a plan's `job_id` and `state`; `host list --json` the queue's `hosts`).
PINNED_SHAPES: dict[str, type[BaseModel]] = {
    "load": LoadStatus,
    "health": Health,
    "list": JobSummary,
    "budget": LedgerSummary,
    "budget --month": MonthSpend,
    "budget --team": TeamSpend,
    "team list": TeamRow,
    "ledger restore": Restored,
}
NAME = r"[a-z_][a-z0-9_]*"
BARE_NAMES = re.compile(rf"\s*{NAME}(?:\s*,\s*{NAME})*\s*")
QUOTED = re.compile(r'"([^"\n]*)"')


def property_names(schema: Any) -> Iterator[str]:
    """Every property name anywhere in a JSON Schema (its `$defs` included)."""
    if isinstance(schema, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict):
            yield from properties
        for value in schema.values():
            yield from property_names(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from property_names(value)


def known_json_keys() -> set[str]:
    keys: set[str] = set()
    for path in (DOCS / "schema").glob("*.json"):
        keys |= set(property_names(json.loads(path.read_text(encoding="utf-8"))))
    for model in PINNED_SHAPES.values():
        keys |= set(property_names(model.model_json_schema(mode="serialization")))
    return keys


def json_keys(text: str) -> list[str]:
    """The keys a JSON-like text names, as the docs write shapes: `{"a": 1}`, `{"a", "b"}` (the
    keys alone), `{"a" (1 = next), "b"}`, `"route": "local" | "cloud"`, `name: {...}`. A quoted
    word is a key when a colon follows it, or when it stands in an object (not after a colon or
    a `|`, not before a `|`); in a list it is a value."""
    keys = [m.group(1) for m in re.finditer(rf"^\s*({NAME}):\s*[\[{{]", text)]
    stack: list[str] = []
    at = 0
    for match in QUOTED.finditer(text):
        for char in text[at : match.start()]:
            if char in "[{":
                stack.append(char)
            elif char in "]}" and stack:
                stack.pop()
        at = match.end()
        before = text[: match.start()].rstrip()[-1:]
        after = text[match.end() :].lstrip()[:1]
        if after == ":" or (stack[-1:] == ["{"] and before not in (":", "|") and after != "|"):
            keys.append(match.group(1))
    return keys


def named_in(span: str) -> list[str]:
    """The keys one inline code span names: a JSON-like shape's keys, else bare names (`a`,
    `a, b`, `a: false`)."""
    if "{" in span and QUOTED.search(span):
        return json_keys(span)
    if BARE_NAMES.fullmatch(span):
        return [name.strip() for name in span.split(",")]
    found = re.fullmatch(rf"\s*({NAME}):\s*[^{{\[]*", span)
    return [found.group(1)] if found else []


def blocks(text: str) -> Iterator[tuple[bool, str]]:
    """A page as (fenced, text) blocks: each fenced block whole; outside them each paragraph,
    list item and table row on its own."""
    fenced = False
    lines: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("```"):
            if lines:
                yield fenced, "\n".join(lines)
            fenced, lines = not fenced, []
            continue
        starts = re.match(r"\s*(?:[-*] |\d+\. |\|)", line) or not line.strip()
        if not fenced and starts and lines:
            yield False, "\n".join(lines)
            lines = []
        if fenced or line.strip():
            lines.append(line)


JSON_SPAN = r"`[^`]*--json[^`]*`"
SPANS = r"((?:`[^`]+`,?\s*(?:and\s+)?)+)"
# "`status --json` has its `queue`", "`--json` prints the LoadStatus: `a, b`", "`--json` as its
# `clearing`", "(`a`, `b` in `--json`", "`{...}` per host in `--json`", "`{...}` plus `a`, `b`".
AFTER_JSON = re.compile(
    rf"{JSON_SPAN}\s+(?:has its|has the \w+ in|has|as its|prints the \w+:|prints|keeps)\s+{SPANS}"
)
BEFORE_JSON = re.compile(rf"{SPANS}(?:per \w+\s+)?in\s+{JSON_SPAN}")
PLUS = re.compile(rf"\}}`\s+plus\s+{SPANS}")
JQ = re.compile(r"--json\b.*?\|\s*jq\s+(?:-\w+\s+)*'?([^'\s|]+)")


def json_keys_shown(text: str) -> Iterator[str]:
    """The `--json` keys a page names:
    - in a paragraph, list item or table row that shows `--json`: every JSON-like inline span
      after it (`{"job_id", "state"}`, `queue: {...}`), and the plain names of the forms people
      write (AFTER_JSON, BEFORE_JSON, PLUS above);
    - in a fenced block: the keys of the output under a `spillway ... --json` line (up to the
      next `$ ` prompt), and each `.name` of a `spillway ... --json | jq EXPR`."""
    for fenced, block in blocks(text):
        if fenced:
            output: list[str] | None = None
            for line in block.splitlines():
                command = line.strip().removeprefix("$ ")
                if line.strip().startswith("$ ") or command.startswith("spillway "):
                    if output:
                        yield from json_keys("\n".join(output))
                    output = [] if command.startswith("spillway ") and "--json" in command else None
                    for expression in JQ.findall(command):
                        yield from re.findall(rf"\.({NAME})", expression)
                elif output is not None:
                    output.append(line)
            if output:
                yield from json_keys("\n".join(output))
            continue
        first = re.search(JSON_SPAN, block)
        if first is None:
            continue
        for span in re.findall(r"`([^`]+)`", block[first.end() :]):
            if "{" in span and QUOTED.search(span):
                yield from json_keys(span)
        for pattern in (AFTER_JSON, BEFORE_JSON, PLUS):
            for spans in pattern.findall(block):
                for span in re.findall(r"`([^`]+)`", spans):
                    yield from named_in(span)


def test_every_json_key_the_readme_and_the_guide_name_is_in_the_schema_or_a_pinned_shape():
    """What a script reads off `--json` is what the docs say: every key the README and docs/
    name for a `--json` output (json_keys_shown says where it looks) is a property of a
    published schema (docs/schema/) or of the model another `--json` output is dumped from
    (PINNED_SHAPES). A key in the wrong object still passes: the names are what is checked."""
    known = known_json_keys()
    found = [
        f"{page.relative_to(PROJECT_ROOT)}: {key!r}"
        for page in PAGES
        for key in dict.fromkeys(json_keys_shown(page.read_text(encoding="utf-8")))
        if key not in known
    ]
    assert not found, "keys no --json output has:\n" + "\n".join(found)
    shown = (
        '`status --json` prints `{"job_id", "route": "local" | "cloud", "queue":\n'
        '{"position" (1 = next), "ahead"}, "reasons": ["armed"]}` plus `host`, `budget`; '
        "`patience_until` per job in `--json`.\n\n"
        "```sh\n$ spillway list --json | jq -r '.[0].state'\n"
        '$ spillway quote --graph g.json --json\n{"local": {"eta_s": 1}}\n```\n'
    )
    assert list(dict.fromkeys(json_keys_shown(shown))) == [
        *("job_id", "route", "queue", "position", "ahead", "reasons"),  # not "local", "armed"
        *("patience_until", "host", "budget"),
        *("state", "local", "eta_s"),
    ]
