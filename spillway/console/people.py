"""Who may sign in to the console (`spillway console user add|list|remove`): one file in
SPILLWAY_SECRETS_DIR holding each person's name and a salted hash of their token. The token itself
is printed once, when it is made, and kept nowhere: a leaked people file signs nobody in."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, ValidationError

from spillway.core.errors import ConfigError, Failed
from spillway.core.settings import describe_validation_error, secrets_dir

PEOPLE_FILE = "SPILLWAY_CONSOLE_PEOPLE.json"
# So a token pasted where it does not belong is recognisable as one.
TOKEN_PREFIX = "spw_"  # noqa: S105 (a prefix, no secret)
# A person's name is what the console sends as `--by` (an approval's, a cancel's `by`).
PersonName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,63}$")]


class Person(BaseModel):
    name: PersonName
    salt: str
    # sha256 over salt and token: a token is 32 random bytes, so no slow KDF is needed to stop a
    # guess, and checking one stays cheap enough to do on every API call.
    token_sha256: str
    added: datetime


class PeopleFile(BaseModel):
    people: dict[str, Person] = {}


def _digest(salt: str, token: str) -> str:
    return hashlib.sha256(f"{salt}:{token}".encode()).hexdigest()


class People:
    """The people file of one folder, read again at each check, so `user remove` takes effect
    at once in a running console (its sessions included)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    @classmethod
    def from_environment(cls) -> People:
        return cls(secrets_dir())

    @property
    def path(self) -> Path | None:
        return None if self.folder is None else self.folder / PEOPLE_FILE

    def read(self) -> PeopleFile:
        path = self.path
        if path is None or not path.is_file():
            return PeopleFile()
        try:
            return PeopleFile.model_validate_json(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
        except ValidationError as exc:
            raise ConfigError(f"{path}: {describe_validation_error(exc, 'people file')}") from None

    def _write(self, held: PeopleFile) -> None:
        path = self.needed()
        assert self.folder is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        fresh = path.with_suffix(".tmp")
        # Readable by its owner only, as the other secrets of the folder; replaced whole so a
        # console reading it never sees half a file.
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(held.model_dump_json(indent=2))
        fresh.replace(path)

    def needed(self) -> Path:
        path = self.path
        if path is None:
            raise ConfigError(
                "SPILLWAY_SECRETS_DIR is not set: the console keeps its people (their tokens' "
                "hashes) in that folder; set it as for the workers"
            )
        return path

    def add(self, name: str) -> str:
        """The new person's token (shown once). Failed when the name is taken."""
        try:
            Person.model_validate(
                {"name": name, "salt": "", "token_sha256": "", "added": datetime.now(UTC)}
            )
        except ValidationError:
            raise ConfigError(
                f"{name!r} is not a person's name: letters, digits, space and ._@+- (64 at most), "
                "starting with a letter or digit"
            ) from None
        self.needed()
        held = self.read()
        if name in held.people:
            raise Failed(f"{name} is a console user already: remove them first for a new token")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        held.people[name] = Person(
            name=name, salt=salt, token_sha256=_digest(salt, token), added=datetime.now(UTC)
        )
        self._write(held)
        return token

    def remove(self, name: str) -> None:
        held = self.read()
        if name not in held.people:
            raise Failed(f"no console user {name!r}")
        del held.people[name]
        self._write(held)

    def names(self) -> list[Person]:
        return sorted(self.read().people.values(), key=lambda p: p.name)

    def who(self, token: str) -> str | None:
        """The name of the person whose token this is; None for any other string."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
            return None
        found = None
        for person in self.read().people.values():
            # Every entry is compared, each in constant time: the answer's time says nothing.
            if hmac.compare_digest(_digest(person.salt, token), person.token_sha256):
                found = person.name
        return found

    def has(self, name: str) -> bool:
        return name in self.read().people


def list_json(people: list[Person]) -> str:
    return json.dumps([{"name": p.name, "added": p.added.isoformat()} for p in people], indent=2)
