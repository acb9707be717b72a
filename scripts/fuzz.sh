#!/usr/bin/env bash
# fuzz.sh TARGET PACKAGE FUZZTIME MINIMIZETIME: fuzz one target for
# FUZZTIME, as `make fuzz-short` does, and try once more when the only
# failure is the fuzzing engine's own deadline.
#
# Go 1.26's fuzzing engine can fail a target that found nothing when a
# worker is still busy as -fuzztime runs out, which a loaded machine makes
# likely (fixed in Go 1.27): the target fails with the message "context
# deadline exceeded" alone and writes no input. A finding always says
# "Failing input written to". Only that exact outcome is run again, once; a
# second failure of any kind fails, and so does every other failure the
# first time. (A budget of executions, -fuzztime Nx, has no deadline to
# race, but Go's engine ran 4 to 13 times slower with one in a trial
# here, 2026-12-03.)
set -uo pipefail

target=${1:?usage: fuzz.sh TARGET PACKAGE FUZZTIME MINIMIZETIME}
pkg=${2:?usage: fuzz.sh TARGET PACKAGE FUZZTIME MINIMIZETIME}
fuzztime=${3:?usage: fuzz.sh TARGET PACKAGE FUZZTIME MINIMIZETIME}
minimize=${4:?usage: fuzz.sh TARGET PACKAGE FUZZTIME MINIMIZETIME}
GO=${GO:-go}

out=$(mktemp)
trap 'rm -f "$out"' EXIT

run() {
	"$GO" test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" -fuzzminimizetime="$minimize" "$pkg" 2>&1 | tee "$out"
	return "${PIPESTATUS[0]}"
}

# engineDeadline: the run failed with the engine's deadline as its only
# message, and wrote no input.
engineDeadline() {
	grep -q '^    context deadline exceeded$' "$out" &&
		! grep -q 'Failing input written to' "$out" &&
		! grep -qE '^panic:|^fatal error:|_test\.go:[0-9]+:' "$out"
}

run && exit 0
status=$?
if engineDeadline; then
	echo "fuzz.sh: $target failed with the fuzzing engine's own deadline and wrote no input; running it once more" >&2
	run && exit 0
	status=$?
fi
exit "$status"
