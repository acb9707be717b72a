package main

import (
	"net/http"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"walden/agent"
	"walden/broker"
	"walden/metrics"
	"walden/version"
)

// processRegistry is a registry with the Go runtime, process and build
// series every walden process exports.
func processRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.NewCollector())
	return reg
}

func handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// agentLease adapts an agent's lease to the metrics package (nil: no lease
// yet).
func agentLease(a func() *agent.Agent) func() metrics.AgentLease {
	return func() metrics.AgentLease {
		ag := a()
		if ag == nil {
			return metrics.AgentLease{}
		}
		l := ag.Lease()
		return metrics.AgentLease{Epoch: l.Epoch, Valid: l.Valid, Remaining: l.Remaining, Fenced: l.Fenced}
	}
}

// brokerMetrics returns the handler that serves the metrics of `walden
// broker` (the agent's lease and renewals, the broker's status and its API
// calls), the gRPC server options that measure its data API, and the
// observer of the embedded agent's renewals.
func brokerMetrics(brokerID string, b func() *broker.Broker) (http.Handler, []grpc.ServerOption, func(string)) {
	reg := processRegistry()
	renewals := metrics.NewAgentRenewals(brokerID)
	reg.MustRegister(renewals.Collectors()...)
	api := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	reg.MustRegister(api)
	reg.MustRegister(metrics.NewAgentCollector(brokerID, agentLease(func() *agent.Agent {
		if br := b(); br != nil {
			return br.Agent()
		}
		return nil
	})))
	reg.MustRegister(metrics.NewBrokerCollector(brokerID, func() metrics.BrokerStatus {
		br := b()
		if br == nil {
			return metrics.BrokerStatus{}
		}
		st := br.Status()
		return metrics.BrokerStatus{Serving: st.GetServing(), Uploads: st.GetUploads(), WALPendingBytes: st.GetWalPendingBytes(), Streams: len(st.GetStreams())}
	}))
	return handler(reg), []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(api.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(api.StreamServerInterceptor()),
	}, renewals.Renewal
}
