package controller

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"
)

// The SASL mechanisms of an AutoMQ controller listener that the client
// speaks (franz-go's implementations).
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Defaults of Config.
const (
	DefaultClientID        = "walden"
	DefaultDialTimeout     = 5 * time.Second
	DefaultRequestTimeout  = 10 * time.Second
	DefaultAttempts        = 3
	DefaultRetryBackoff    = 200 * time.Millisecond
	DefaultMaxRetryBackoff = 2 * time.Second
)

// Config says how to reach the active controller of an AutoMQ cluster.
type Config struct {
	// Voters are the controller quorum's addresses on the controller
	// listener, host:port each: the addresses of AutoMQ's
	// controller.quorum.voters (without the "id@" prefixes). Required.
	Voters []string
	// TLS, when not nil, is the client side of the controller listener's
	// TLS (SSL or SASL_SSL): the CA that signed the controllers'
	// certificates, and a client certificate if they ask for one. nil is
	// plaintext. An empty ServerName is set to each voter's host.
	TLS *tls.Config
	// SASL, when its Mechanism is set, authenticates to the controller
	// listener (SASL_PLAINTEXT or SASL_SSL).
	SASL SASL
	// ClientID is the client id of every request (the controllers' logs
	// and quotas name it). Default "walden".
	ClientID string
	// DialTimeout bounds a TCP connect (and TLS handshake) to one voter.
	// Default 5s.
	DialTimeout time.Duration
	// RequestTimeout bounds one attempt at one voter, connecting,
	// ApiVersions and SASL included: 100ms to 15m. Default 10s.
	RequestTimeout time.Duration
	// Attempts is how many rounds over the voters one call makes before it
	// gives up, when no voter answered as the active controller or when a
	// request that is safe to repeat failed. Default 3.
	Attempts int
	// RetryBackoff is the wait before the second round, doubled before
	// each next one up to MaxRetryBackoff (with up to a fifth of jitter).
	// Defaults 200ms and 2s.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// Logger receives the client's decisions (a voter skipped, the
	// controller found) and, at debug level, franz-go's own logs. Default
	// slog.Default().
	Logger *slog.Logger
}

// SASL is the controller listener's SASL login.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty for none.
	Mechanism string
	Username  string
	Password  string
}

// DefaultConfig returns a config with every default and no voters.
func DefaultConfig() Config {
	return Config{
		ClientID:        DefaultClientID,
		DialTimeout:     DefaultDialTimeout,
		RequestTimeout:  DefaultRequestTimeout,
		Attempts:        DefaultAttempts,
		RetryBackoff:    DefaultRetryBackoff,
		MaxRetryBackoff: DefaultMaxRetryBackoff,
	}
}

// ConfigError names the key of a config that is not valid and why.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string {
	return "automq controller: invalid config: " + e.Key + ": " + e.Reason
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Validate checks the config and names the first offending key.
func (c Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
	}
	if len(c.Voters) == 0 {
		return bad("voters", "required: the controller quorum's host:port addresses on the controller listener")
	}
	seen := map[string]int{}
	for i, v := range c.Voters {
		key := fmt.Sprintf("voters[%d]", i)
		if strings.Contains(v, "@") {
			return bad(key, "%q: give host:port without the node id (controller.quorum.voters lists id@host:port)", v)
		}
		host, port, err := net.SplitHostPort(v)
		if err != nil {
			return bad(key, "%q is not host:port", v)
		}
		if host == "" {
			return bad(key, "%q has no host", v)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return bad(key, "%q: port %q is not 1..65535", v, port)
		}
		if j, dup := seen[v]; dup {
			return bad(key, "%q is voters[%d] again", v, j)
		}
		seen[v] = i
	}
	switch c.SASL.Mechanism {
	case "":
		if c.SASL.Username != "" || c.SASL.Password != "" {
			return bad("sasl.mechanism", "required with sasl.username and sasl.password: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.SASL.Username == "" {
			return bad("sasl.username", "required by sasl.mechanism %s", c.SASL.Mechanism)
		}
		if c.SASL.Password == "" {
			return bad("sasl.password", "required by sasl.mechanism %s", c.SASL.Mechanism)
		}
	default:
		return bad("sasl.mechanism", "%q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", c.SASL.Mechanism)
	}
	if c.ClientID == "" || len(c.ClientID) > 0x7fff {
		return bad("client_id", "%d bytes: want 1 to 32767", len(c.ClientID))
	}
	if c.DialTimeout <= 0 {
		return bad("dial_timeout", "%s: must be positive", c.DialTimeout)
	}
	if c.RequestTimeout < 100*time.Millisecond || c.RequestTimeout > 15*time.Minute {
		return bad("request_timeout", "%s: want 100ms to 15m", c.RequestTimeout)
	}
	if c.Attempts < 1 || c.Attempts > 100 {
		return bad("attempts", "%d: want 1..100", c.Attempts)
	}
	if c.RetryBackoff <= 0 {
		return bad("retry_backoff", "%s: must be positive", c.RetryBackoff)
	}
	if c.MaxRetryBackoff < c.RetryBackoff {
		return bad("max_retry_backoff", "%s is below retry_backoff %s", c.MaxRetryBackoff, c.RetryBackoff)
	}
	return nil
}
