"""The Airflow side of batch inference: planning, fan-out (kubernetes pods or local subprocesses), the
completion gate, publish, the cost report, and the factory of the three DAGs. Never imports torch or vLLM.

Modules: ``planner`` (manifest from input metadata), ``params`` (trigger form, ``RunConfig``),
``pod_spec`` (KubernetesPodOperator kwargs, offline rendering), ``local_runner`` (the worker as a
subprocess), ``completion`` / ``triggers`` / ``sensors`` (the gate), ``tasks`` (task bodies),
``dag_factory`` (the DAGs), ``cli`` (``make run`` / ``make render-k8s``), ``publish``, ``report``,
``progress``.
"""
