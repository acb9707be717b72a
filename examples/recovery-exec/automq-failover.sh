#!/usr/bin/env bash
# automq-failover.sh — walden's exec recovery action for AutoMQ 1.x brokers,
# wrapping `walden automq failover`: the same failover as the native
# `recovery.action: automq`, run as a command of your own. Use it when the
# failover must run somewhere walden's coordinators do not reach by themselves
# (a host that sees the WAL volume, a wrapper that takes site locks or pages
# someone first). Without such a need, prefer the native action
# (docs/automq.md): it checkpoints every step in the job.
#
# Configure a coordinator with:
#
#   recovery:
#     action: exec                   # the whole recovery (op "recover")
#     exec:
#       command: /etc/walden/automq-failover.sh
#       args: ["/etc/walden/automq.yaml"]   # the failover's config: the keys of recovery.automq
#       timeout: 1h
#
# The broker's agent registers its AutoMQ node (automq.node_id in its
# configuration); the job hands it over as automq_node_id.
#
# THE CONTRACT (docs/recovery.md):
#   stdin   one JSON object, the job, e.g.
#             {"op":"recover","job_id":"job-b3-17","broker_id":"b3","token":17,"attempt":2,
#              "assignee_id":"c1","volume_id":"vol-0abc","wal_path":"/dev/nvme1n1",
#              "automq_node_id":3,"automq_node_epoch":1733000000000}
#   env     WALDEN_OP, WALDEN_JOB_ID, WALDEN_BROKER_ID, WALDEN_TOKEN, WALDEN_ATTEMPT;
#           WALDEN (this script's addition) is the walden binary, default "walden".
#   stdout  JSON progress lines ({"step":..., "detail":...}); other lines are logged.
#   exit    0 = every opening stream of the node was closed at AutoMQ's
#           controller with nothing dropped; anything else is retried with
#           backoff, the end of stderr shown as the job's error. Running it again
#           is safe: `walden automq failover` commits nothing twice.
set -euo pipefail

config=${1:?usage: automq-failover.sh CONFIG.yaml (the keys of recovery.automq)}
walden=${WALDEN:-walden}
job=$(cat)

# field NAME prints a flat string or number field of the job.
field() {
	printf '%s' "$job" | sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p" | head -n1
}
progress() { printf '%s\n' "$1"; }

case "${WALDEN_OP:-}" in
recover)
	wal=$(field wal_path)
	node=$(field automq_node_id)
	if [ -z "$wal" ]; then
		echo "job ${WALDEN_JOB_ID}: the broker registered no WAL path" >&2
		exit 2
	fi
	if [ -z "$node" ]; then
		echo "job ${WALDEN_JOB_ID}: broker ${WALDEN_BROKER_ID} registered no AutoMQ node: set automq.node_id in its agent's configuration" >&2
		exit 2
	fi
	progress "{\"step\":\"read\",\"detail\":\"walden automq failover of node ${node} from ${wal}\"}"
	out=$("$walden" automq failover --config "$config" --wal "$wal" --node-id "$node" -o json) || {
		rc=$?
		printf '%s\n' "$out" | sed -n 's/.*"error": "\(.*\)".*/\1/p' >&2
		exit "$rc"
	}
	streams=$(printf '%s\n' "$out" | grep -c '"stream_id"' || true)
	uploaded=$(printf '%s\n' "$out" | sed -n 's/^  "bytes_uploaded": \([0-9]*\).*/\1/p')
	progress "{\"step\":\"close\",\"streams_closed\":${streams},\"streams_total\":${streams},\"bytes_uploaded\":${uploaded:-0},\"bytes_total\":${uploaded:-0},\"detail\":\"node ${node}: ${streams} streams closed at AutoMQ's controller, ${uploaded:-0} bytes uploaded\"}"
	;;
fence | attach | detach)
	echo "op ${WALDEN_OP} is a plugin op: use this script as recovery.action exec only" >&2
	exit 2
	;;
*)
	echo "unknown op ${WALDEN_OP:-}" >&2
	exit 2
	;;
esac
