#!/usr/bin/env bash
# automq-failover.sh — an exec plugin and exec action for walden that hands
# the recovery of a dead AutoMQ broker to AutoMQ itself (Client#failover).
#
# Configure a coordinator with:
#
#   recovery:
#     action: exec            # the whole recovery (op "recover")
#     fence: exec             # optional: op "fence" before it
#     exec:
#       command: /etc/walden/automq-failover.sh
#       args: ["--bootstrap-server", "kafka-0:9092"]
#       timeout: 10m
#
# THE CONTRACT (docs/recovery.md):
#   stdin   one JSON object, the job:
#             {"op":"recover","job_id":"job-b3-17","broker_id":"b3","token":17,
#              "attempt":2,"assignee_id":"c1","volume_id":"vol-0abc","wal_path":"/dev/nvme1n1",
#              "streams":[{"stream_id":42,"epoch":3,"start_offset":0,"end_offset":1200}],
#              "s3":{"endpoint":"http://...","region":"us-east-1","bucket":"walden","prefix":"wal"}}
#           op is "fence", "attach", "detach" (plugins) or "recover" (the action).
#   env     WALDEN_OP, WALDEN_JOB_ID, WALDEN_BROKER_ID, WALDEN_TOKEN, WALDEN_ATTEMPT
#   stdout  JSON lines, each optional field:
#             {"step":"upload","bytes_uploaded":1048576,"bytes_total":4194304,
#              "streams_closed":0,"streams_total":3,"detail":"...",
#              "path":"/dev/sdw",                 (attach: the WAL path)
#              "recovered_wal_offset":123456}     (recover: the broker trims to it)
#           steps: fence attach read upload commit close detach done.
#           Other lines are logged and ignored.
#   stderr  logged; its last 2 KiB become the job's error on failure.
#   exit    0 = done; anything else = failed, retried with backoff, the error
#           shown in `waldenctl job ID`. The same attempt may run the command
#           again: it must be idempotent (AutoMQ's failover is: a committed
#           object is REDUNDANT, a closed stream stays closed).
#   time    killed after exec.timeout; also killed when the attempt becomes
#           stale (the job was reassigned or cancelled).
#
# After exit 0 of "recover", walden closes in its own catalog the streams of
# the broker still opened there and marks the job succeeded.
set -euo pipefail

job=$(cat)
field() { # crude JSON field extraction for flat string/number fields
	printf '%s' "$job" | sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p" | head -n1
}
progress() { printf '%s\n' "$1"; }

case "${WALDEN_OP}" in
fence)
	# STONITH the old host: e.g. IPMI power off, a cloud API, or nothing
	# when AutoMQ's own node fencing (FailoverMode on the controller) is enough.
	progress "{\"detail\":\"no STONITH: AutoMQ fences node ${WALDEN_BROKER_ID} in failover mode\"}"
	;;
recover)
	node_id=${WALDEN_BROKER_ID#b}    # walden broker "b3" ↔ AutoMQ node 3
	volume=$(field volume_id)
	device=$(field wal_path)
	progress "{\"step\":\"attach\",\"detail\":\"AutoMQ attaches ${volume} itself\"}"
	# AutoMQ 1.4: Client#failover(FailoverRequest{nodeId, nodeEpoch, volumeId, device}).
	# It opens the WAL in recovery mode, GetOpeningStreams(failover=true),
	# uploads, commits in failover mode and closes the streams.
	# Replace the echo below with your wrapper around it, e.g.:
	#   java -cp "$AUTOMQ_HOME/libs/*" com.example.Failover "$@" \
	#        --node-id "$node_id" --node-epoch "$WALDEN_TOKEN" \
	#        --volume-id "$volume" --device "$device"
	echo "would call Client#failover(nodeId=${node_id}, nodeEpoch=${WALDEN_TOKEN}, volumeId=${volume}, device=${device}) $*" >&2
	progress '{"step":"upload","detail":"AutoMQ failover running"}'
	progress '{"step":"close","detail":"AutoMQ closed the streams"}'
	;;
attach | detach)
	echo "op ${WALDEN_OP} not used with action exec" >&2
	exit 2
	;;
*)
	echo "unknown op ${WALDEN_OP}" >&2
	exit 2
	;;
esac
