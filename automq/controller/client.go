package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"walden/automq/protocol"
	"walden/version"
)

// softwareName is the ClientSoftwareName of walden's ApiVersions requests.
const softwareName = "walden"

// Client calls the active controller of an AutoMQ cluster. It is safe for
// concurrent use. franz-go's kgo holds the connections (one per voter,
// opened on first use), negotiates ApiVersions, TLS and SASL; the Client
// chooses the voter, the version of each request and what to retry.
type Client struct {
	cfg    Config
	log    *slog.Logger
	kc     *kgo.Client
	voters []*kgo.Broker // cfg.Voters' brokers, in the same order

	// active is the index of the voter that answered last as the active
	// controller; every call starts with it.
	active atomic.Int64
	// answered is whether any voter answered yet.
	answered atomic.Bool
	closed   atomic.Bool

	mu sync.Mutex
	// versions holds each voter's max version per API key, from its
	// ApiVersions; forgotten when a request to it fails on the transport.
	versions map[int]map[int16]int16
}

// New returns a Client of the voters; it connects on the first call.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	// kgo refuses keys it does not know unless the max versions allow them.
	maxVersions := kversion.Stable()
	for _, a := range protocol.APIs {
		maxVersions.SetMaxKeyVersion(a.Key, a.MaxVersion)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Voters...),
		kgo.MaxVersions(maxVersions),
		kgo.ClientID(cfg.ClientID),
		kgo.SoftwareNameAndVersion(softwareName, softwareVersion()),
		kgo.DialTimeout(cfg.DialTimeout),
		kgo.RequestTimeoutOverhead(cfg.RequestTimeout),
		kgo.WithLogger(kgoLogger{log}),
	}
	if cfg.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg.TLS.Clone()))
	}
	if m := saslMechanism(cfg.SASL); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	kc, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("automq controller: %w: %w", ErrInvalidConfig, err)
	}
	voters := kc.SeedBrokers()
	if len(voters) != len(cfg.Voters) {
		kc.Close()
		return nil, fmt.Errorf("automq controller: %w: %d voters configured, franz-go kept %d", ErrInvalidConfig, len(cfg.Voters), len(voters))
	}
	return &Client{cfg: cfg, log: log, kc: kc, voters: voters, versions: map[int]map[int16]int16{}}, nil
}

// Close closes the connections; calls in flight fail.
func (c *Client) Close() {
	if c.closed.Swap(true) {
		return
	}
	c.kc.Close()
}

// Controller is the address of the voter that answered last as the active
// controller, or "" before any answered.
func (c *Client) Controller() string {
	if !c.answered.Load() {
		return ""
	}
	return c.cfg.Voters[c.active.Load()]
}

func saslMechanism(s SASL) sasl.Mechanism {
	switch s.Mechanism {
	case SASLPlain:
		return plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism()
	case SASLScramSHA256:
		return scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism()
	case SASLScramSHA512:
		return scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism()
	}
	return nil
}

// softwareVersion is walden's version as Kafka accepts a
// ClientSoftwareVersion: letters, digits, '.' and '-', starting and ending
// with a letter or digit (a controller answers INVALID_REQUEST otherwise).
func softwareVersion() string {
	v := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '-'
	}, version.Get().Version)
	v = strings.Trim(v, ".-")
	if v == "" {
		return "unknown"
	}
	return v
}

// call is one API call: how to build the request at the version the voter
// speaks, and whether it may be sent again when its answer was lost.
type call struct {
	api int16
	// repeatable is whether sending the request again after its answer
	// was lost is harmless (see the package doc for each API).
	repeatable bool
	// build returns the request at version v, or why it cannot be built
	// (protocol's Validate error).
	build func(v int16) (protocol.Message, error)
}

// outcome is what one attempt at one voter came to.
type outcome int

const (
	answered      outcome = iota // the active controller answered (maybe with an error code)
	notSent                      // the request was not sent: try the next voter
	badCredential                // TLS or SASL refused us: try the others, but no further round
	notController                // a standby answered NOT_CONTROLLER: try the next voter
	retriable                    // the controller answered a code that may clear; repeat if repeatable
	lost                         // sent, no usable answer: repeat only if repeatable
	refused                      // the request cannot be built for this voter: final
)

// do sends one call to the active controller: the voter that answered
// last first, then the others in order, at most cfg.Attempts rounds with
// a growing backoff between them, each attempt bounded by
// cfg.RequestTimeout and all of them by ctx.
func (c *Client) do(ctx context.Context, cl call) (kmsg.Response, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	n := len(c.voters)
	failures := make([]error, n)
	noController := func(rounds int, ctxErr error) error {
		e := &NoControllerError{API: cl.api, Rounds: rounds, Ctx: ctxErr}
		for i, f := range failures {
			if f != nil {
				e.Failures = append(e.Failures, VoterFailure{Voter: c.cfg.Voters[i], Err: f})
			}
		}
		return e
	}
	backoff := c.cfg.RetryBackoff
	rounds := 0
	for rounds < c.cfg.Attempts {
		if rounds > 0 {
			wait := backoff + time.Duration(rand.Int64N(int64(backoff)/5+1))
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, noController(rounds, ctx.Err())
			case <-t.C:
			}
			backoff = min(2*backoff, c.cfg.MaxRetryBackoff)
		}
		rounds++
		lastRound := false
		start := int(c.active.Load())
		for i := range n {
			idx := (start + i) % n
			voter := c.cfg.Voters[idx]
			resp, out, err := c.try(ctx, idx, cl)
			if out == answered || out == retriable {
				if prev := c.active.Swap(int64(idx)); prev != int64(idx) || !c.answered.Load() {
					c.log.Info("automq controller: active controller found", "voter", voter)
				}
				c.answered.Store(true)
			}
			if out == answered {
				return resp, err
			}
			failures[idx] = err
			if ctx.Err() != nil {
				return nil, noController(rounds, ctx.Err())
			}
			switch out {
			case refused:
				return nil, err
			case lost, retriable:
				if !cl.repeatable {
					if out == retriable {
						return nil, err
					}
					return nil, &outcomeUnknownError{api: cl.api, voter: voter, cause: err}
				}
			case badCredential:
				lastRound = true
			}
			level := slog.LevelInfo
			if out == notController {
				level = slog.LevelDebug
			}
			c.log.Log(ctx, level, "automq controller: voter did not serve the request; trying the next",
				"api", protocol.NameForKey(cl.api), "voter", voter, "round", rounds, "err", err)
		}
		if lastRound {
			break
		}
	}
	return nil, noController(rounds, nil)
}

// try sends the call to one voter: its versions first (cached), then the
// request at the highest version both speak.
func (c *Client) try(ctx context.Context, idx int, cl call) (kmsg.Response, outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	voter := c.cfg.Voters[idx]
	name := protocol.NameForKey(cl.api)
	versions, err := c.apiVersions(ctx, idx)
	if err != nil {
		// Our request was not sent: the connection, TLS, SASL or
		// ApiVersions failed before it.
		if isBadCredential(err) {
			return nil, badCredential, err
		}
		return nil, notSent, err
	}
	theirs, ok := versions[cl.api]
	if !ok {
		return nil, notSent, fmt.Errorf("%w: its ApiVersions lists no %s (key %d): is %s an AutoMQ controller listener?",
			ErrNotAutoMQ, name, cl.api, voter)
	}
	api, _ := protocol.LookupAPI(cl.api)
	v := min(theirs, api.MaxVersion)
	if v < api.MinVersion {
		return nil, notSent, fmt.Errorf("%w: it speaks %s up to v%d only", ErrNotAutoMQ, name, theirs)
	}
	req, err := cl.build(v)
	if err != nil {
		if errors.Is(err, protocol.ErrFieldNotInVersion) {
			return nil, refused, fmt.Errorf("%w: the controller at %s speaks %s up to v%d: %w",
				ErrUnsupportedByController, voter, name, theirs, err)
		}
		return nil, refused, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if err := req.Validate(); err != nil {
		return nil, refused, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	resp, err := c.voters[idx].Request(ctx, pinned{req.(kmsg.Request), v})
	if err != nil {
		c.forgetVersions(idx)
		switch {
		case isBadCredential(err):
			return nil, badCredential, err
		case isNotSent(err):
			return nil, notSent, err
		}
		return nil, lost, describeLost(err, c.cfg.RequestTimeout)
	}
	code := topLevelCode(resp)
	switch {
	case code == 0:
		return resp, answered, nil
	case code == protocol.ErrNotController.Code:
		return nil, notController, protocol.ErrorForCode(cl.api, code)
	}
	err = protocol.ErrorForCode(cl.api, code)
	var apiErr *protocol.APIError
	if errors.As(err, &apiErr) && apiErr.Retriable() {
		return nil, retriable, err
	}
	return resp, answered, err
}

// describeLost says in words what became of a request sent without a
// usable answer.
func describeLost(err error, timeout time.Duration) error {
	switch {
	case errors.Is(err, protocol.ErrTruncated), errors.Is(err, protocol.ErrMalformed):
		return fmt.Errorf("the answer does not decode: %w", err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("the connection closed in the middle of the answer: %w", err)
	case errors.Is(err, io.EOF):
		return fmt.Errorf("the connection closed before the answer: %w", err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		// Our attempt's context or kgo's read deadline, whichever
		// fired first: both are the request timeout.
		return fmt.Errorf("no answer within the request timeout of %s: %w", timeout, err)
	}
	return fmt.Errorf("no answer: %w", err)
}

// apiVersions returns the voter's max version per API key, asking it the
// first time (kgo has asked too when it connected, but does not tell).
func (c *Client) apiVersions(ctx context.Context, idx int) (map[int16]int16, error) {
	c.mu.Lock()
	v, ok := c.versions[idx]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName = softwareName
	req.ClientSoftwareVersion = softwareVersion()
	resp, err := c.voters[idx].Request(ctx, req)
	if err != nil {
		return nil, err
	}
	r, ok := resp.(*kmsg.ApiVersionsResponse)
	if !ok {
		return nil, fmt.Errorf("%w: ApiVersions answered with %T", ErrBadAnswer, resp)
	}
	if err := protocol.ErrorForCode(protocol.KeyApiVersions, r.ErrorCode); err != nil {
		return nil, err
	}
	v = make(map[int16]int16, len(r.ApiKeys))
	for _, k := range r.ApiKeys {
		v[k.ApiKey] = k.MaxVersion
	}
	c.mu.Lock()
	c.versions[idx] = v
	c.mu.Unlock()
	return v, nil
}

func (c *Client) forgetVersions(idx int) {
	c.mu.Lock()
	delete(c.versions, idx)
	c.mu.Unlock()
}

// pinned caps the version kgo picks for a request at the one it was
// validated for: kgo sends min(MaxVersion, the broker's max).
type pinned struct {
	kmsg.Request
	max int16
}

func (p pinned) MaxVersion() int16 { return p.max }

// topLevelCode is the top-level error code of a response of this package.
//
// OpenStreams and CloseStreams are answered stream by stream: AutoMQ 1.4.1's
// controller handles each stream as an event of its own, so a standby
// controller answers NOT_CONTROLLER in every stream's code and 0 at the
// top. Such an answer counts as NOT_CONTROLLER (the request changed
// nothing): the client moves to the next voter.
func topLevelCode(resp kmsg.Response) int16 {
	switch r := resp.(type) {
	case *protocol.OpenStreamsResponse:
		if r.ErrorCode == 0 && len(r.OpenStreamResponses) > 0 && allNotController(len(r.OpenStreamResponses), func(i int) int16 { return r.OpenStreamResponses[i].ErrorCode }) {
			return protocol.ErrNotController.Code
		}
		return r.ErrorCode
	case *protocol.CloseStreamsResponse:
		if r.ErrorCode == 0 && len(r.CloseStreamResponses) > 0 && allNotController(len(r.CloseStreamResponses), func(i int) int16 { return r.CloseStreamResponses[i].ErrorCode }) {
			return protocol.ErrNotController.Code
		}
		return r.ErrorCode
	case *protocol.PrepareS3ObjectResponse:
		return r.ErrorCode
	case *protocol.CommitStreamSetObjectResponse:
		return r.ErrorCode
	case *protocol.GetOpeningStreamsResponse:
		return r.ErrorCode
	case *protocol.AutomqGetNodesResponse:
		return r.ErrorCode
	}
	return 0
}

func allNotController(n int, code func(int) int16) bool {
	for i := 0; i < n; i++ {
		if code(i) != protocol.ErrNotController.Code {
			return false
		}
	}
	return true
}

// isNotSent reports whether a transport error happened before the request
// left: the connection could not be opened, or died while kgo set it up
// (its ApiVersions or SASL exchange).
func isNotSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var first *kgo.ErrFirstReadEOF
	return errors.As(err, &first)
}

// isBadCredential reports whether TLS or SASL refused the connection: the
// configuration, not the voter, is at fault, so further rounds cannot help.
func isBadCredential(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verification     *tls.CertificateVerificationError
		header           tls.RecordHeaderError
		alert            tls.AlertError
	)
	switch {
	case errors.As(err, &unknownAuthority), errors.As(err, &hostname), errors.As(err, &invalid),
		errors.As(err, &verification), errors.As(err, &header), errors.As(err, &alert):
		return true
	}
	return errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) ||
		errors.Is(err, kerr.IllegalSaslState)
}

// kgoLogger hands franz-go's logs to the client's logger at debug level:
// the client logs its own decisions.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel {
	if k.l.Enabled(context.Background(), slog.LevelDebug) {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelNone
}

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	k.l.Debug("franz-go: "+msg, append(keyvals, "kgo_level", level.String())...)
}
