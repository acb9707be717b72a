package server

import (
	"context"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"walden/authz"
	"walden/fieldlimit"
	waldenv1 "walden/proto/walden/v1"
)

// newAdminGRPC builds the admin gRPC server: walden.v1.Cluster, the health
// service and reflection, behind recovery, request metrics, authorization,
// size limits and logging interceptors (in that order: a refusal is
// counted, and the log line of a call names its identity).
func newAdminGRPC(admin *adminService, hs *health.Server, creds credentials.TransportCredentials, az *authz.Authorizer, reg prometheus.Registerer, logger *slog.Logger, opts ...grpc.ServerOption) (*grpc.Server, error) {
	metrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	if err := reg.Register(metrics); err != nil {
		return nil, err
	}
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(codeToLevel),
		logging.WithFieldsFromContext(identityFields),
	}
	panicHandler := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in gRPC handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	s := grpc.NewServer(append(opts,
		grpc.Creds(creds),
		grpc.InitialWindowSize(adminStreamWindow),
		grpc.InitialConnWindowSize(adminConnWindow),
		grpc.ReadBufferSize(adminReadBuffer),
		grpc.SharedWriteBuffer(true),
		grpc.ChainUnaryInterceptor(
			recovery.UnaryServerInterceptor(panicHandler),
			metrics.UnaryServerInterceptor(),
			az.UnaryInterceptor(),
			fieldlimit.UnaryInterceptor(),
			quietHotCalls(logger, logging.UnaryServerInterceptor(slogAdapter(logger), logOpts...)),
		),
		grpc.ChainStreamInterceptor(
			recovery.StreamServerInterceptor(panicHandler),
			exceptRenewals(metrics.StreamServerInterceptor()),
			az.StreamInterceptor(),
			exceptRenewals(fieldlimit.StreamInterceptor()),
			logging.StreamServerInterceptor(slogAdapter(logger), logOpts...),
		))...,
	)
	waldenv1.RegisterClusterServer(s, admin)
	healthpb.RegisterHealthServer(s, hs)
	reflection.Register(s)
	metrics.InitializeMetrics(s)
	return s, nil
}

// The admin server's flow-control windows, fixed: with them set, grpc does
// not estimate the bandwidth-delay product, which costs a ping and its
// answer (a write and a read on each side) after every message received on
// an idle connection — doubling what a lease renewal costs, every agent
// renewing with every coordinator every second. A megabyte per stream and
// four per connection (grpc's default starts at 64 KiB and may grow to 16
// MiB) keep a backup download fast at the round trips of one region.
//
// Every agent keeps a connection to every coordinator, so what a
// connection holds while idle is paid thousands of times: its read buffer
// is 4 KiB (grpc's default of 32 KiB serves large frames no faster, which
// it reads past the buffer anyway), and its write buffer is taken from a
// pool for each flush and given back, not kept.
const (
	adminStreamWindow = 1 << 20
	adminConnWindow   = 4 << 20
	adminReadBuffer   = 4 << 10
)

// codeToLevel sets the level of a finished call's log line: successful
// calls at debug (status polling, lease renewals and catalog commits are
// frequent; see changesState for the ones logged at info), expected
// refusals (a fenced epoch, a stream another broker holds, not the leader:
// the callers retry or move on) at debug, callers' mistakes at info,
// refused identities and server-side failures at warn or error.
func codeToLevel(code codes.Code) logging.Level {
	switch code {
	case codes.OK, codes.Canceled, codes.FailedPrecondition, codes.Unavailable:
		return logging.LevelDebug
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.OutOfRange:
		return logging.LevelInfo
	case codes.PermissionDenied, codes.Unauthenticated, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return logging.LevelWarn
	default:
		return logging.LevelError
	}
}

// changesState are the methods whose successful calls are logged at info,
// with the identity that made them: what operators and admins change, a
// broker's registration, a stream changing hands, and backups. (A lease
// renewal or a catalog commit is routine and stays at debug.)
var changesState = map[string]bool{
	waldenv1.Cluster_MemberAdd_FullMethodName:      true,
	waldenv1.Cluster_MemberRemove_FullMethodName:   true,
	waldenv1.Cluster_LeaderTransfer_FullMethodName: true,
	waldenv1.Agent_Register_FullMethodName:         true,
	waldenv1.Brokers_Failover_FullMethodName:       true,
	waldenv1.Brokers_Ack_FullMethodName:            true,
	waldenv1.Brokers_SetMaintenance_FullMethodName: true,
	waldenv1.Brokers_SetPolicy_FullMethodName:      true,
	waldenv1.Catalog_OpenStream_FullMethodName:     true,
	waldenv1.Catalog_CloseStream_FullMethodName:    true,
	waldenv1.Jobs_CancelJob_FullMethodName:         true,
	waldenv1.Jobs_RetryJob_FullMethodName:          true,
	waldenv1.Maintenance_Snapshot_FullMethodName:   true,
}

// callLevel raises the successful calls of changesState to info.
func callLevel(lvl logging.Level, fields []any) logging.Level {
	if lvl != logging.LevelDebug {
		return lvl
	}
	var service, method, code string
	for i := 0; i+1 < len(fields); i += 2 {
		k, _ := fields[i].(string)
		v, _ := fields[i+1].(string)
		switch k {
		case logging.ServiceFieldKey:
			service = v
		case logging.MethodFieldKey:
			method = v
		case "grpc.code":
			code = v
		}
	}
	if code == codes.OK.String() && changesState["/"+service+"/"+method] {
		return logging.LevelInfo
	}
	return lvl
}

// hotCalls are the calls every agent makes to every coordinator every
// second or so (lease_ttl/3): thousands a second on a coordinator of
// thousands of brokers.
var hotCalls = map[string]bool{waldenv1.Agent_RenewLease_FullMethodName: true}

// exceptRenewals spares the renewal streams (Agent.RenewLeases) a stream
// interceptor that works on every message: a stream carries one renewal
// per second or so from every agent, and counting each message by method
// and code (grpc_server_msg_*) cost a tenth of what a renewal costs the
// coordinator. walden_lease_renewal_streams and walden_lease_renewals_total
// count the streams and renewals instead; fieldlimit's bounds have nothing
// to check in a renewal (a broker id, which the handler checks, and two
// integers). The authorization still checks every renewal.
func exceptRenewals(inner grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod == waldenv1.Agent_RenewLeases_FullMethodName {
			return handler(srv, ss)
		}
		return inner(srv, ss, info, handler)
	}
}

// quietHotCalls spares the hot calls the logging interceptor when their
// line would not be written: that interceptor builds the fields of every
// call before it knows the call's level, which costs twice what a grant
// itself does. A hot call that ends at a level the logger writes (a
// caller's mistake, a failure) is logged as the interceptor would.
func quietHotCalls(logger *slog.Logger, inner grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !hotCalls[info.FullMethod] || logger.Enabled(ctx, slog.LevelDebug) {
			return inner(ctx, req, info, handler)
		}
		start := time.Now()
		resp, err := handler(ctx, req)
		code := status.Code(err)
		lvl := codeToLevel(code)
		if !logger.Enabled(ctx, slog.Level(lvl)) {
			return resp, err
		}
		service, method, _ := strings.Cut(strings.TrimPrefix(info.FullMethod, "/"), "/")
		fields := []any{"protocol", "grpc", logging.ComponentFieldKey, "server", logging.ServiceFieldKey, service,
			logging.MethodFieldKey, method, logging.MethodTypeFieldKey, "unary", "grpc.code", code.String()}
		if err != nil {
			fields = append(fields, "grpc.error", err.Error())
		}
		fields = append(fields, identityFields(ctx)...)
		fields = append(fields, logging.DurationToTimeMillisFields(time.Since(start))...)
		slogAdapter(logger).Log(ctx, lvl, "finished call", fields...)
		return resp, err
	}
}

func identityFields(ctx context.Context) logging.Fields {
	id, ok := authz.FromContext(ctx)
	if !ok || id.IsAnonymous() {
		return nil
	}
	f := logging.Fields{"identity", id.Name, "role", string(id.Role)}
	if id.Via != "" {
		f = append(f, "via", id.Via)
	}
	return f
}

func slogAdapter(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(callLevel(lvl, fields)), msg, fields...)
	})
}

// The services the health service reports on, as Kubernetes probes and
// load balancers read them:
//
//   - "" is liveness: SERVING while the process works, also while this
//     member knows no leader (a quorum loss must not get every member
//     restarted when they must stay up); NOT_SERVING once it stops.
//   - walden.v1.Cluster is readiness: SERVING while the member knows a
//     leader and has applied what was committed when it started (Ready).
const livenessService = ""

var readinessService = waldenv1.Cluster_ServiceDesc.ServiceName

// watchLeader keeps readiness in step with the node (see readinessService)
// and logs every leader change with the term. It returns when ctx is done.
func watchLeader(ctx context.Context, node ClusterNode, hs *health.Server, every time.Duration, logger *slog.Logger) {
	hs.SetServingStatus(livenessService, healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(readinessService, healthpb.HealthCheckResponse_NOT_SERVING)
	leader, ready := "", false
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if now := node.LeaderID(); now != leader {
			st := node.Status()
			if now == "" {
				logger.Warn("leader lost", "previous_leader_id", leader, "term", st.Term)
			} else {
				logger.Info("leader known", "leader_id", now, "previous_leader_id", leader, "term", st.Term, "raft_state", st.RaftState)
			}
			leader = now
		}
		if r := node.Ready(); r != ready {
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if r {
				st = healthpb.HealthCheckResponse_SERVING
			}
			hs.SetServingStatus(readinessService, st)
			ready = r
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
