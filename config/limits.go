package config

import (
	"errors"

	"walden/connlimit"
	"walden/httplimit"
)

// ServerLimits bound a coordinator's listeners (docs/security.md): the
// connections open at once, in all and from one source address, the time
// a new connection has for its handshakes, and on the gRPC listeners the
// calls in flight per connection and the keepalive pings allowed.
type ServerLimits struct {
	// Admin bounds listen.admin.
	Admin connlimit.GRPC `yaml:"admin"`
	// Raft bounds listen.raft.
	Raft connlimit.GRPC `yaml:"raft"`
	// HTTP bounds listen.http.
	HTTP httplimit.Limits `yaml:"http"`
	// Metrics bounds listen.metrics.
	Metrics httplimit.Limits `yaml:"metrics"`
}

// DefaultServerLimits are the safe defaults of a coordinator's listeners.
func DefaultServerLimits() ServerLimits {
	return ServerLimits{Admin: connlimit.Defaults(connlimit.Admin), Raft: connlimit.Defaults(connlimit.Raft),
		HTTP: httplimit.Defaults(), Metrics: httplimit.Defaults()}
}

// AgentLimits bound an agent's listener.
type AgentLimits struct {
	// HTTP bounds the agent's local endpoint (listen).
	HTTP httplimit.Limits `yaml:"http"`
}

// BrokerLimits bound a broker's listeners.
type BrokerLimits struct {
	// API bounds the data API (listen).
	API connlimit.GRPC `yaml:"api"`
	// AgentHTTP bounds the embedded agent's endpoint (agent_listen).
	AgentHTTP httplimit.Limits `yaml:"agent_http"`
}

// DefaultBrokerLimits are the safe defaults of a broker's listeners.
func DefaultBrokerLimits() BrokerLimits {
	return BrokerLimits{API: connlimit.Defaults(connlimit.BrokerAPI), AgentHTTP: httplimit.AgentDefaults()}
}

// limit checks one listener's limits, reporting under prefix
// ("limits.admin").
func (v *validator) limit(prefix string, l interface{ Validate() error }) {
	err := l.Validate()
	var ke *connlimit.KeyError
	switch {
	case err == nil:
	case errors.As(err, &ke):
		v.add(prefix+"."+ke.Key, "%s", ke.Reason)
	default:
		v.add(prefix, "%v", err)
	}
}
