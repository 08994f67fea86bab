"""Trees on DBOS (issue 25): ``fanfold worker``, ``fanfold run --detach``, ``fanfold wait``.

Nothing here is imported by ``import fanfold`` or by a run on SQLite: the CLI commands
import these modules when they run, and only ``dbos_worker``, ``leases`` and
``client`` import the ``postgres`` extra (DBOS, psycopg). ``spec`` (what a detached
tree is started with) and ``waiting`` (a tree's outcome read from the log) need
neither. DESIGN.md, "Beyond one machine (issue 25)", says what is built and why.
"""
