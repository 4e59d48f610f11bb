"""The run directory's file names, in one place for the job that writes them and the
auditor that reads them (the audit-trail files are named in ``_audit``)."""

from __future__ import annotations

__all__ = [
    "DATA_PLANE_FILE",
    "JOB_FILE",
    "PLOT_FILE",
    "RUN_LOG",
    "SERVERS_DIR",
    "SERVERS_FILE",
    "SHARDS_DIR",
]

#: The job's configuration: a run directory belongs to one job.
JOB_FILE = "job.toml"
#: The durable row store (staging and canonical rows).
DATA_PLANE_FILE = "dataplane.sqlite"
#: One line per start or resume; never cut back.
RUN_LOG = "run_log.jsonl"
#: Mean reward per step, restarts and checkpoints marked.
PLOT_FILE = "reward.png"
#: The local generation servers a job with ``[http] servers = []`` started (url, pid, log).
SERVERS_FILE = "servers.json"
#: Their ready files and logs.
SERVERS_DIR = "servers"
#: The Ray backend's data shards: ``shard-<i>.sqlite`` each (instead of DATA_PLANE_FILE).
SHARDS_DIR = "shards"
