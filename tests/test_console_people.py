"""The console's people and sessions, without a server: a token is shown once and kept only as a
salted hash; a removed person's token and sessions stop at once; a cookie that was changed,
signed with another key or has expired signs nobody in."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from spillway.console.people import PEOPLE_FILE, People
from spillway.console.sessions import Signer
from spillway.core.errors import ConfigError, Failed
from tests.support.cli import one_line, spillway


def test_a_token_is_kept_only_as_a_salted_hash_and_names_its_person(tmp_path: Path):
    people = People(tmp_path / "secrets")
    ana, bob = people.add("ana"), people.add("bob")
    held = (tmp_path / "secrets" / PEOPLE_FILE).read_text()
    assert ana not in held and bob not in held
    assert ana[4:20] not in held  # not even a part of it
    assert stat.S_IMODE((tmp_path / "secrets" / PEOPLE_FILE).stat().st_mode) == 0o600
    stored = json.loads(held)["people"]
    assert stored["ana"]["salt"] != stored["bob"]["salt"]
    assert (people.who(ana), people.who(bob)) == ("ana", "bob")
    assert people.who(ana + "x") is None and people.who("") is None
    assert people.who("not-a-token") is None
    assert [p.name for p in people.names()] == ["ana", "bob"]


def test_a_name_taken_or_malformed_is_refused_and_a_removed_person_signs_in_no_more(
    tmp_path: Path,
):
    people = People(tmp_path)
    token = people.add("ana")
    with pytest.raises(Failed, match="ana is a console user already"):
        people.add("ana")
    for bad in ("", "-ana", "a/b", "x" * 65, "ana\n"):
        with pytest.raises(ConfigError, match="is not a person's name"):
            people.add(bad)
    people.remove("ana")
    assert people.who(token) is None and not people.has("ana")
    with pytest.raises(Failed, match="no console user 'ana'"):
        people.remove("ana")


def test_without_a_secrets_folder_nobody_can_be_added():
    with pytest.raises(ConfigError, match="SPILLWAY_SECRETS_DIR is not set"):
        People(None).add("ana")
    assert People(None).names() == []


def test_a_session_cookie_changed_or_signed_with_another_key_is_nobody_s():
    signer = Signer(b"k1")
    cookie = signer.session_cookie("ana")
    session = signer.session(cookie)
    assert session is not None and session.name == "ana" and len(session.csrf) > 20
    body, _, mac = cookie.partition(".")
    assert Signer(b"k2").session(cookie) is None
    assert signer.session(body + "." + mac[:-2] + "AA") is None
    assert signer.session(body) is None and signer.session("") is None
    assert signer.session("x" * 5000) is None
    assert signer.session(cookie, now=time.time() + 11 * 3600) is not None
    assert signer.session(cookie, now=time.time() + 13 * 3600) is None  # a working day


async def test_the_user_commands_print_the_token_once_and_exit_as_the_cli_contract_says(
    cli_env, tmp_path: Path
):
    env = cli_env(SPILLWAY_SECRETS_DIR=str(tmp_path / "secrets"))
    code, token, err = await spillway("console", "user", "add", "ana", env=env)
    assert code == 0 and token.strip().startswith("spw_") and "shown this once" in err
    code, listed, _ = await spillway("console", "user", "list", "--json", env=env)
    assert code == 0 and [p["name"] for p in json.loads(listed)] == ["ana"]
    assert token.strip() not in listed
    assert (await spillway("console", "user", "add", "ana", env=env))[0] == 1  # taken
    assert (await spillway("console", "user", "add", "a/b", env=env))[0] == 2  # bad input
    assert (await spillway("console", "user", "remove", "ana", env=env))[0] == 0
    assert (await spillway("console", "user", "remove", "ana", env=env))[0] == 1
    code, _, err = await spillway("console", "user", "list", env=cli_env())
    assert code == 2 and "SPILLWAY_SECRETS_DIR is not set" in one_line(err)
