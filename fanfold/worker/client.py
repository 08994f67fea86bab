"""``fanfold run --detach``: put a tree on the workers' queue (a DBOS client, no runtime)."""

from __future__ import annotations

from dbos import DBOSClient, EnqueueOptions

from fanfold.worker.serialization import SERIALIZER, refuse_pickle
from fanfold.worker.spec import APP_NAME, APP_VERSION, QUEUE, WORKFLOW, TreeSpec


def enqueue_tree(system_url: str, spec: TreeSpec) -> str:
    """Enqueue ``spec`` as the tree workflow whose id is its root id; returns that id.

    DBOS keeps one workflow per id: enqueueing the same id again returns the existing
    one (the first spec stands)."""
    refuse_pickle()  # this client reads nothing back, but never a pickle if it did
    client = DBOSClient(
        system_database_url=system_url, application_name=APP_NAME, serializer=SERIALIZER
    )
    try:
        options: EnqueueOptions = {
            "workflow_name": WORKFLOW,
            "queue_name": QUEUE,
            "workflow_id": spec.root_id,
            "app_version": APP_VERSION,
        }
        return str(client.enqueue(options, spec.to_input()).get_workflow_id())
    finally:
        client.destroy()
