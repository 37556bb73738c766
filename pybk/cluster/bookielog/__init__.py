"""The BookieLog controller: a named log's desired spec + what was observed -> the next actions.

`spec` parses the manifest, `controller.plan`/`plan_delete` decide (pure), `store` observes the log
and carries the actions out on a BookKeeper client; the operator (pybk/operator/log_handlers.py)
and the local platform (pybk/local/logs.py) do the Kubernetes or file side around them.
"""
