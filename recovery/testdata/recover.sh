#!/usr/bin/env bash
# Exec action used by the tests: fails its first run (exit 3) to prove the
# retry, then reports progress lines and succeeds.
#   recover.sh STATE_DIR
set -euo pipefail
state_dir=$1
job=$(cat)
case "$job" in
*'"op":"recover"'*) ;;
*) echo "not a recover job: $job" >&2; exit 2 ;;
esac
printf '%s\n' "$job" > "$state_dir/recover.json"
echo "run attempt=$WALDEN_ATTEMPT" >> "$state_dir/calls.log"
if [ ! -e "$state_dir/failed-once" ]; then
	touch "$state_dir/failed-once"
	echo "controller unreachable" >&2
	exit 3
fi
echo '{"step":"attach","detail":"opened the WAL"}'
echo '{"step":"upload","bytes_uploaded":512,"bytes_total":1024}'
sleep 0.3
echo '{"step":"upload","bytes_uploaded":1024,"bytes_total":1024}'
echo '{"step":"commit","detail":"committed"}'
echo '{"step":"close","streams_closed":2,"streams_total":3,"recovered_wal_offset":123456}'
