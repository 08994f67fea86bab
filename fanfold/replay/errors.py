"""The exceptions of ``fanfold.replay``: each names what is wrong in one line."""

from __future__ import annotations

from fanfold.replay.report import Divergence, Finding


class ReplayFailure(Exception):
    """Base class of every error raised by ``fanfold.replay``."""


class LogCorrupt(ReplayFailure):
    """The log itself is damaged where the operation needed it; ``finding`` says how."""

    def __init__(self, finding: Finding) -> None:
        self.finding = finding
        super().__init__(f"the log is damaged: {finding}")


class LogDiverged(ReplayFailure):
    """Today's reducer does not reproduce the log where the operation needed it."""

    def __init__(self, divergence: Divergence) -> None:
        self.divergence = divergence
        super().__init__(
            f"{divergence.headline()}; run `fanfold replay "
            f"{divergence.conversation_id} --verify` for the diff"
        )


class NoSuchStep(ReplayFailure, LookupError):
    """The conversation has no event with that seq."""

    def __init__(self, conversation_id: str, seq: int, last_seq: int) -> None:
        self.conversation_id = conversation_id
        self.seq = seq
        self.last_seq = last_seq
        super().__init__(
            f"conversation {conversation_id!r} has no event {seq}: its events are 0 to {last_seq}"
        )


class ForkRefused(ReplayFailure):
    """A conversation cannot be forked at that seq.

    ``before`` and ``after`` are the nearest seqs where it can be (None if none).
    """

    def __init__(
        self,
        message: str,
        *,
        conversation_id: str,
        seq: int,
        before: int | None = None,
        after: int | None = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.seq = seq
        self.before = before
        self.after = after
        super().__init__(message)


class EditRefused(ForkRefused):
    """An edit does not fit the picked conversation at that seq (the reducer refuses
    it there, or it can only take effect as the fork goes on); nothing was written."""


class ImportRefused(ReplayFailure):
    """A JSON Lines log cannot be imported; nothing was written.

    ``line`` is the 1-based line of the file at fault, when one is.
    """

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


class VersionRefused(ImportRefused):
    """The log was written with an event schema version this fanfold cannot read."""

    def __init__(
        self, message: str, *, found: object, supported: int, line: int | None = None
    ) -> None:
        self.found = found
        self.supported = supported
        super().__init__(message, line=line)
