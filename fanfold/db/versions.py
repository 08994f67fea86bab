"""The codec's document version, in a module of its own: ``fanfold.db.schema`` checks it
on every open of a log, which must not import the codec and the reducer for it (a
``fanfold ls`` decodes nothing, issue 36). ``fanfold.db.codec`` re-exports it."""

from __future__ import annotations

SCHEMA_VERSION = 7
"""Version written into every document; decoding accepts 1..SCHEMA_VERSION.

History: 2 added the token accounting of sub-agent trees (``ChildSucceeded.tokens``,
``ChildFailed.tokens``, ``PendingChild.budget``, ``Conversation.usage_children``); 3
added ``ConversationCreated.workdir`` (where a sub-agent's working directory really
is) and the error kind ``invalid_cwd``; 4 added ``CallModel.attempt`` and
``StartTimer.counts_downtime`` (facts the runtime used to work out itself); 5 added
``ChildSucceeded.submitted`` (whether a sub-agent called ``submit_result`` or ended
with plain text), written only when False (see ``OMITTED_AT_DEFAULT``), and
``ModelError.usage`` (the tokens of a failed attempt), written only when not zero; 6
retired ``CallModel.request`` (see ``RETIRED``); 7 added ``Children.summary`` and the
context mode ``summary`` of ``ChildSpec.context`` (issue 12), written only when used.
"""
