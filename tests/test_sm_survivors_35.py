"""Example tests for the real survivors of the mutation sample drawn on the reducer with
approvals (issue 34, seed 20261208; DESIGN.md "Mutation testing", bench/README.md).

Each test pins behaviour a surviving mutant changed; each was checked to fail on a
hand-made copy of its mutant and to pass on the code.
"""

from __future__ import annotations

import fanfold.statemachine  # noqa: F401  (the selection rule reads this file's imports)
