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
	"walden/connlimit"
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

// agentBrokerObserver turns the agent's broker supervision into metrics.
type agentBrokerObserver struct{ m *metrics.AgentBroker }

func (o agentBrokerObserver) BrokerState(s agent.BrokerState) { o.m.State(string(s)) }
func (o agentBrokerObserver) WatchdogArmed(armed bool)        { o.m.Armed(armed) }
func (o agentBrokerObserver) CheckFailed(check string)        { o.m.CheckFailed(check) }
func (o agentBrokerObserver) Kill(k agent.KillRecord) {
	o.m.Kill(k.Reason, k.Latency, k.Lead, k.Reason == agent.KillLease)
}

// newAgentBrokerMetrics registers the series of an agent's broker
// supervision in reg.
func newAgentBrokerMetrics(reg *prometheus.Registry, brokerID string) agentBrokerObserver {
	states := make([]string, 0, len(agent.BrokerStates))
	for _, s := range agent.BrokerStates {
		states = append(states, string(s))
	}
	m := metrics.NewAgentBroker(brokerID, states, agent.KillReasons, agent.BrokerChecks)
	reg.MustRegister(m.Collectors()...)
	return agentBrokerObserver{m: m}
}

// brokerMetrics returns the handler that serves the metrics of `walden
// broker` (the agent's lease and renewals, the broker's status and its API
// calls), the gRPC server options that measure its data API, and the
// observer of the embedded agent's renewals.
func brokerMetrics(brokerID string, b func() *broker.Broker) (http.Handler, []grpc.ServerOption, func(string), *connlimit.Metrics) {
	reg := processRegistry()
	listeners := connlimit.NewMetrics()
	reg.MustRegister(listeners.Collectors()...)
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
	}, renewals.Renewal, listeners
}
