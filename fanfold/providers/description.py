"""``ProviderDescription``: which provider configuration a tree runs on, as recorded in
its provenance record, so that ``fanfold resume`` rebuilds the same provider instead of
guessing (it used to finish every crashed tree on the built-in demo script).

What is recorded: the scripted-reply file (absolute path, or ``builtin:code_review``
for the packaged demo) and its sha256; the TOML config file and its sha256; the root
and sub-agent profile names and the root's model. Never a key, nor the value of any
variable: keys are read from the environment again when the provider is rebuilt.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from fanfold.db.provenance import sha256_of_file
from fanfold.examples import CODE_REVIEW_SCRIPT

BUILTIN_SCRIPTS = {"builtin:code_review": CODE_REVIEW_SCRIPT}
"""Scripts packaged with fanfold, by the name a description records for them."""

SCRIPT = "script"
"""Kind of a description: scripted replies from one file (``--script``, or the demo)."""
CONFIG = "config"
"""Kind of a description: profiles of a configuration (file and/or environment)."""


class DescriptionError(ValueError):
    """A recorded description cannot be read, or no longer matches the files on disk."""


@attrs.frozen
class FileDigest:
    """A file a provider was built from: its absolute path (or a ``builtin:`` name) and
    the sha256 of its bytes then."""

    path: str
    sha256: str

    @classmethod
    def of(cls, path: str | Path) -> FileDigest:
        """Describe ``path`` as it is now (OSError if it cannot be read)."""
        resolved = Path(path).resolve()
        for name, builtin in BUILTIN_SCRIPTS.items():
            if resolved == builtin.resolve():
                return cls(name, sha256_of_file(builtin))
        return cls(str(resolved), sha256_of_file(resolved))

    def local_path(self) -> Path:
        """Where the file is on this machine (a builtin's packaged file)."""
        return BUILTIN_SCRIPTS.get(self.path, Path(self.path))

    def problem(self, what: str) -> str | None:
        """Why the file can no longer be used as recorded, or None if it is unchanged."""
        try:
            now = sha256_of_file(self.local_path())
        except OSError as exc:
            return (
                f"the {what} it runs on, {self.path} (sha256 {self.sha256[:16]}...), "
                f"cannot be read now: {exc.strerror or exc}"
            )
        if now != self.sha256:
            return (
                f"the {what} it runs on, {self.path}, changed since it was recorded "
                f"(sha256 {self.sha256[:16]}... then, {now[:16]}... now)"
            )
        return None


@attrs.frozen
class ProviderDescription:
    """The provider configuration of a tree (see the module docstring).

    ``kind`` SCRIPT: ``script`` is the replies file. ``kind`` CONFIG: ``config`` is the
    TOML file read (None: none, the environment or the built-in offline profile),
    ``profile``/``sub_agents`` the profile names of roots and sub-agents, ``model`` the
    root profile's model, and ``script`` the replies file of scripted profiles (the demo).
    """

    kind: str
    script: FileDigest | None = None
    config: FileDigest | None = None
    profile: str | None = None
    sub_agents: str | None = None
    model: str | None = None

    def to_json(self) -> str:
        """Canonical JSON text, as stored in the tree's record."""
        return json.dumps(attrs.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ProviderDescription:
        """Read a stored description; DescriptionError if it is not one."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("kind") not in (SCRIPT, CONFIG):
                raise TypeError("not a provider description")
            files: dict[str, FileDigest] = {}
            for name in ("script", "config"):
                value = data.get(name)
                if value is not None:
                    if not isinstance(value, dict) or set(value) != {"path", "sha256"}:
                        raise TypeError(f"bad {name}")
                    if not all(isinstance(v, str) for v in value.values()):
                        raise TypeError(f"bad {name}")
                    files[name] = FileDigest(value["path"], value["sha256"])
            names: dict[str, str | None] = {}
            for name in ("profile", "sub_agents", "model"):
                value = data.get(name)
                if value is not None and not isinstance(value, str):
                    raise TypeError(f"bad {name}")
                names[name] = value
            if set(data) - {"kind", "script", "config", "profile", "sub_agents", "model"}:
                raise TypeError("unknown fields")
        except (ValueError, TypeError) as exc:
            raise DescriptionError(
                f"the recorded provider configuration is unreadable: {exc}"
            ) from None
        except RecursionError:  # an imported log's record, nested too deeply
            raise DescriptionError(
                "the recorded provider configuration is unreadable: nested too deeply"
            ) from None
        if data["kind"] == SCRIPT and "script" not in files:
            raise DescriptionError("the recorded provider configuration names no script")
        return cls(
            data["kind"],
            script=files.get("script"),
            config=files.get("config"),
            profile=names["profile"],
            sub_agents=names["sub_agents"],
            model=names["model"],
        )

    def problems(self) -> list[str]:
        """What keeps this configuration from being rebuilt exactly as recorded: files
        that are missing, unreadable or changed since (empty if none)."""
        found = []
        if self.script is not None:
            found.append(self.script.problem("script"))
        if self.config is not None:
            found.append(self.config.problem("config file"))
        return [p for p in found if p is not None]

    def summary(self) -> str:
        """One line for the user: what the tree runs on."""
        if self.kind == SCRIPT:
            assert self.script is not None
            return f"scripted ({self.script.path})"
        where = self.config.path if self.config is not None else "no config file"
        model = f" {self.model}" if self.model else ""
        return f"{self.profile}{model} ({where})"
