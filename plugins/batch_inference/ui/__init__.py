"""The **Batch inference** page in the Airflow UI (an Airflow 3.3 plugin).

* :mod:`.plugin` - the :class:`~airflow.plugins_manager.AirflowPlugin` (loaded by every Airflow component,
  so it imports nothing heavy: the FastAPI app is built on the API server's first request).
* :mod:`.app` - the FastAPI app mounted under :data:`.plugin.URL_PREFIX`: HTML pages and a JSON API,
  every route behind Airflow's own authentication and DAG authorisation.
* :mod:`.status` - DagRun/TaskInstance states + shard markers -> Batch-API status (``validating``,
  ``in_progress``, ``finalizing``, ``completed``, ``failed``, ``cancelled``, ``expired``).
* :mod:`.figures` - rows, rate, ETA and cost of one run from its objects in storage.
* :mod:`.guard` - the storage allow-list check every read goes through.
* :mod:`.discovery` - the runs of the batch-inference DAGs in Airflow's metadata DB.
* :mod:`.deadletters` - the dead-letter rows of a run as JSONL / CSV.
* :mod:`.links` - the operator extra link from a run's ``publish`` / ``summary`` task to its page.

See ``docs/ui.md``.
"""
