#!/usr/bin/env bash
# Exec fence/attach plugin used by the tests: logs each call, keeps the job
# JSON it was given, and answers the contract of docs/recovery.md.
#   plugin.sh LOG_DIR WAL_PATH
set -euo pipefail
log_dir=$1
wal_path=$2
job=$(cat)
printf '%s\n' "$job" > "$log_dir/$WALDEN_OP.json"
echo "$WALDEN_OP $WALDEN_BROKER_ID token=$WALDEN_TOKEN attempt=$WALDEN_ATTEMPT" >> "$log_dir/calls.log"
case "$WALDEN_OP" in
fence)
	echo "stopping the host of $WALDEN_BROKER_ID" >&2
	printf '{"detail":"host of %s powered off"}\n' "$WALDEN_BROKER_ID"
	;;
attach)
	echo "not json: ignored"
	printf '{"path":"%s"}\n' "$wal_path"
	;;
detach)
	printf '{"detail":"released %s"}\n' "$wal_path"
	;;
*)
	echo "unexpected op $WALDEN_OP" >&2
	exit 2
	;;
esac
