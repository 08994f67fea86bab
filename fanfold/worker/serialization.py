"""What fanfold's workers and clients let DBOS read from the system database: JSON only.

DBOS stores a workflow's input, its steps' outputs and errors in its system database,
each with the name of the format it was written in (a ``serialization`` column).
DBOS 3.4's default is ``py_pickle`` (pickle, base64), and it decodes a row by the
name the row gives, whatever serializer the application configured: a row that says
``py_pickle`` is unpickled. Whoever can write to the system database (enqueue a
workflow) could therefore run code in every worker that dequeues it (issue 32, item
13: a pickled input wrote a proof file as the worker's user, and the workflow was
recorded SUCCESS).

fanfold closes that in two parts:

- everything fanfold's workers and clients write is DBOS's portable JSON
  (``SERIALIZER``, passed as ``DBOSConfig["serializer"]`` and to every
  ``DBOSClient``): a tree's input is plain data already (``TreeSpec.to_input``);
- ``refuse_pickle()`` replaces DBOS's pickle decoder (``dbos._serialization.
  DBOSDefaultSerializer``, the one object every ``py_pickle`` row is decoded with) by
  one that refuses to decode: a workflow whose input is pickled ends in ERROR without
  running anything (DBOS marks a workflow whose input cannot be decoded ERROR),
  and a pickled output or error is never read. Encoding in pickle stays possible (DBOS
  itself records the error of such a workflow in the row's own format): writing a
  pickle runs nothing.

The second part reaches into a private module of DBOS: ``check_pickle_refused()``
verifies that DBOS still decodes through the replaced object, and the worker refuses
to start if it does not (a DBOS upgrade that moved the decoder).
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

from dbos import DBOSPortableJSONSerializer, Serializer

SERIALIZER: Serializer = DBOSPortableJSONSerializer()
"""The serializer of fanfold's workers and DBOS clients (``portable_json``)."""

PICKLE = "py_pickle"


class PickleRefused(ValueError):
    """A row of the system database in pickle: fanfold does not decode it."""


class _RefusingPickle(Serializer):
    """DBOS's ``py_pickle`` format, able to encode and unable to decode."""

    def serialize(self, data: Any) -> str:
        return base64.b64encode(pickle.dumps(data)).decode("ascii")

    def deserialize(self, serialized_data: str) -> Any:
        raise PickleRefused(
            "a pickled value in the system database (serialization py_pickle): fanfold "
            "reads JSON only and does not unpickle what anyone who can write to the "
            "queue put there"
        )

    def name(self) -> str:
        return PICKLE


def refuse_pickle() -> None:
    """Make DBOS, in this process, refuse every ``py_pickle`` row (idempotent)."""
    import dbos._serialization as serialization

    if not isinstance(serialization.DBOSDefaultSerializer, _RefusingPickle):
        serialization.DBOSDefaultSerializer = _RefusingPickle()


def check_pickle_refused() -> str | None:
    """None if DBOS in this process refuses a pickled workflow input; else why not (a
    DBOS release that decodes ``py_pickle`` elsewhere than where ``refuse_pickle``
    reaches)."""
    from dbos._serialization import deserialize_args, deserialize_value

    probe = base64.b64encode(pickle.dumps({"args": (), "kwargs": {}})).decode("ascii")
    for decode in (deserialize_args, deserialize_value):
        try:
            decode(probe, PICKLE, SERIALIZER)
        except PickleRefused:
            continue
        except Exception as exc:  # any other failure: not the refusal we rely on
            return f"DBOS's {decode.__name__} failed otherwise ({type(exc).__name__})"
        return f"DBOS's {decode.__name__} still unpickles py_pickle rows"
    return None
