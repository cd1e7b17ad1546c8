"""Node services, one module per concern; everything an agent can do is scoped to its own node.

- `tokens`: agent tokens (issue, hash, find the node by token)
- `inventory`: registration (GPUs by slot and UUID)
- `heartbeat`: liveness, fencing on return, telemetry intake
- `gpu_health`: acting on a GPU's health assessment
- `faults`: what a platform fault does to the jobs it hits
- `loss`: the loss sweep and its storm guard
- `operator`: cordon, uncordon, drain, reset health, retire
- `states`: the node state machine (one table, one function)
- `assignments`: what a node must run or stop
- `reports`: job starts, exits and logs reported by agents
"""

from scheduler.nodes.assignments import assignments_for
from scheduler.nodes.heartbeat import TELEMETRY_TTL_S, node_heartbeat
from scheduler.nodes.inventory import (
    gpu_model_for_product,
    node_inventory_approve,
    node_register,
)
from scheduler.nodes.loss import LOSS_HELD_KEY, loss_storm, lost_nodes_sweep
from scheduler.nodes.operator import node_faults_confirm, node_set_state
from scheduler.nodes.reports import (
    ExitReport,
    agent_reports_apply,
    job_exited,
    job_log_append,
    job_started,
    jobs_started,
    reports_change_assignments,
)
from scheduler.nodes.tokens import (
    AGENT_TOKEN_PREFIX,
    AGENT_TOKEN_TTL_S,
    agent_token_forget,
    agent_token_hash,
    agent_token_key,
    node_for_agent_token_hash,
    node_id_for_agent_token,
    node_issue_agent_token,
)

__all__ = [
    "AGENT_TOKEN_PREFIX",
    "AGENT_TOKEN_TTL_S",
    "LOSS_HELD_KEY",
    "TELEMETRY_TTL_S",
    "ExitReport",
    "agent_reports_apply",
    "agent_token_forget",
    "agent_token_hash",
    "agent_token_key",
    "assignments_for",
    "gpu_model_for_product",
    "job_exited",
    "job_log_append",
    "job_started",
    "jobs_started",
    "loss_storm",
    "lost_nodes_sweep",
    "node_faults_confirm",
    "node_for_agent_token_hash",
    "node_heartbeat",
    "node_id_for_agent_token",
    "node_inventory_approve",
    "node_issue_agent_token",
    "node_register",
    "node_set_state",
    "reports_change_assignments",
]
