package server

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	waldenv1 "walden/proto/walden/v1"
)

// TestQuietHotCallsLogsWhatTheInterceptorWould checks that a lease renewal
// skips the logging interceptor only when its line would not be written:
// an answered renewal writes nothing at info, a caller's mistake is logged
// with the interceptor's keys, and with debug on every call goes through
// the interceptor.
func TestQuietHotCallsLogsWhatTheInterceptorWould(t *testing.T) {
	renew := &grpc.UnaryServerInfo{FullMethod: waldenv1.Agent_RenewLease_FullMethodName}
	status := &grpc.UnaryServerInfo{FullMethod: waldenv1.Cluster_Status_FullMethodName}
	ok := func(context.Context, any) (any, error) { return "ok", nil }
	bad := func(context.Context, any) (any, error) {
		return nil, statusErr(codes.InvalidArgument, "broker_id: must not be empty")
	}
	for _, tc := range []struct {
		name    string
		level   slog.Level
		info    *grpc.UnaryServerInfo
		handler grpc.UnaryHandler
		inner   bool // the logging interceptor runs
		lines   int
	}{
		{"renewal answered, info", slog.LevelInfo, renew, ok, false, 0},
		{"renewal refused, info", slog.LevelInfo, renew, bad, false, 1},
		{"renewal answered, debug", slog.LevelDebug, renew, ok, true, 1},
		{"other call, info", slog.LevelInfo, status, ok, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			logger := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: tc.level}))
			ran := false
			inner := logging.UnaryServerInterceptor(slogAdapter(logger), logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(codeToLevel))
			spy := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				ran = true
				return inner(ctx, req, info, h)
			}
			resp, err := quietHotCalls(logger, spy)(context.Background(), nil, tc.info, tc.handler)
			if want, _ := tc.handler(context.Background(), nil); resp != want {
				t.Fatalf("answer %v, want %v (err %v)", resp, want, err)
			}
			if ran != tc.inner {
				t.Fatalf("logging interceptor ran: %t, want %t", ran, tc.inner)
			}
			if out.Len() == 0 {
				if tc.lines != 0 {
					t.Fatalf("no log line, want %d", tc.lines)
				}
				return
			}
			lines := keysOnce(t, out.String())
			if len(lines) != tc.lines {
				t.Fatalf("%d log lines, want %d: %s", len(lines), tc.lines, out.String())
			}
			l := lines[0]
			if l["msg"] != "finished call" || l[logging.ServiceFieldKey] != "walden.v1.Agent" || l[logging.MethodFieldKey] != "RenewLease" {
				t.Fatalf("line %v", l)
			}
			if l["grpc.code"] == nil || l["grpc.time_ms"] == nil {
				t.Fatalf("line without code or duration: %v", l)
			}
			if err != nil && l["grpc.error"] == nil {
				t.Fatalf("refusal logged without its error: %v", l)
			}
		})
	}
}

func statusErr(c codes.Code, msg string) error { return status.Error(c, msg) }
