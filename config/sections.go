package config

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"walden/gossip"
)

// decoded is a configuration struct that Load and Parse fill: it keeps the
// source it was read from (and fills defaults that depend on what the file
// set), then validates itself.
type decoded interface {
	setSource(src *source)
	Validate() error
}

// validated finishes a LoadXxx or ParseXxx: it hands cfg the source of the
// decoding that returned src and err, and validates it.
func validated[C decoded](cfg C, src *source, err error) (C, error) {
	var zero C
	if err != nil {
		return zero, err
	}
	cfg.setSource(src)
	if err := cfg.Validate(); err != nil {
		return zero, err
	}
	return cfg, nil
}

// The checks below are of the sections and keys that the server, agent and
// broker configurations share; each reports under the key it is given.

// logSection checks log.level and log.format.
func (v *validator) logSection(l Log) {
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		v.add("log.level", "must be one of debug, info, warn, error, got %q", l.Level)
	}
	switch l.Format {
	case "json", "text":
	default:
		v.add("log.format", "must be json or text, got %q", l.Format)
	}
}

// tlsSection checks that the tls files are set together or not at all.
func (v *validator) tlsSection(t TLS) {
	if !t.Enabled() {
		return
	}
	for _, f := range []struct{ key, val string }{
		{"tls.cert_file", t.CertFile}, {"tls.key_file", t.KeyFile}, {"tls.ca_file", t.CAFile},
	} {
		if f.val == "" {
			v.add(f.key, "must be set when any tls file is set (cert_file, key_file and ca_file go together)")
		}
	}
}

// keyAddr is a listen key and its address.
type keyAddr struct{ key, addr string }

// gossipKey is the key a server's gossip address was written under.
func gossipKey(bind string) string {
	if bind != "" {
		return "gossip.listen"
	}
	return "listen.gossip"
}

// isLoopback reports whether a listen address's host is a loopback
// address or "localhost" (an empty host listens on every interface).
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// plaintext refuses, in one line, a configuration that would serve
// plaintext on an address other than loopback: secure by default, with
// insecure: true as the explicit way out (CockroachDB's --insecure). It
// also refuses insecure together with tls.
func (v *validator) plaintext(t TLS, insecure bool, listens []keyAddr) {
	if t.Enabled() {
		if insecure {
			v.add("insecure", "must not be true when tls is set: insecure serves plaintext without authorization; remove one of them")
		}
		return
	}
	if insecure {
		return
	}
	var exposed []keyAddr
	for _, l := range listens {
		if l.addr != "" && checkHostPort(l.addr, false) == nil && !isLoopback(l.addr) {
			exposed = append(exposed, l)
		}
	}
	if len(exposed) == 0 {
		return
	}
	also := ""
	if len(exposed) > 1 {
		keys := make([]string, 0, len(exposed)-1)
		for _, l := range exposed[1:] {
			keys = append(keys, l.key)
		}
		also = " (also " + strings.Join(keys, ", ") + ")"
	}
	v.add(exposed[0].key, "%s is not a loopback address and tls is not set: refusing to serve plaintext without authorization%s; set tls (walden certs makes the files) or insecure: true",
		exposed[0].addr, also)
}

// coordinators checks the coordinators list: at least one address, each
// one others can dial, none twice.
func (v *validator) coordinators(addrs []string) {
	if len(addrs) == 0 {
		v.missing("coordinators", "the coordinators' admin host:port addresses")
	}
	seen := map[string]int{}
	for i, a := range addrs {
		key := fmt.Sprintf("coordinators[%d]", i)
		if v.peerAddr(key, a) {
			if j, dup := seen[a]; dup {
				v.add(key, "duplicate address %s (also coordinators[%d])", a, j)
			}
			seen[a] = i
		}
	}
}

// agentListen checks the address an agent listens on and the coordinators
// dial: a listen address whose host is neither empty nor a wildcard.
func (v *validator) agentListen(key, val string) bool {
	if !v.listenAddr(key, val, true) {
		return false
	}
	if host, _, _ := net.SplitHostPort(val); host == "" {
		v.add(key, "invalid address %q: host must not be empty (coordinators dial it)", val)
		return false
	} else if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		v.add(key, "invalid address %q: a wildcard address cannot be dialled by the coordinators; name this host's address", val)
		return false
	}
	return true
}

// agentGossip checks the gossip section of an agent (its own or the one a
// broker embeds): gossip.listen must be written in the file (what says what
// it holds), and the pool settings must hold for the agent's member once
// cluster_name and broker_id are known. It reports whether gossip.listen
// was given.
func (v *validator) agentGossip(g gossip.Config, clusterName, brokerID, what string) bool {
	if v.src != nil && !v.src.has("gossip.listen") {
		v.missing("gossip.listen", what)
		return false
	}
	if clusterName == "" || brokerID == "" {
		return true
	}
	g.ClusterName = clusterName
	g.NodeName = string(gossip.RoleAgent) + "/" + brokerID
	g.Meta = gossip.Meta{Role: gossip.RoleAgent, ID: brokerID}
	if err := g.Validate(); err != nil {
		var ge *gossip.ConfigError
		if errors.As(err, &ge) && !strings.HasPrefix(ge.Key, "meta") && ge.Key != "cluster_name" && ge.Key != "node_name" {
			v.add("gossip."+ge.Key, "%s", ge.Reason)
		} else {
			v.add("gossip", "%v", err)
		}
	}
	return true
}
