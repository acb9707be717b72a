package recovery

import (
	"context"
	"log/slog"
)

// RunExecForTest runs cfg's command as an exec action would, with an empty
// job on stdin.
func RunExecForTest(ctx context.Context, cfg Exec) error {
	return runExec(ctx, cfg, JobJSON{Op: "recover"}, slog.New(slog.DiscardHandler), nil)
}
