package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/authz"
	"walden/coordclient"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// Names shared with the server's admin API.
const (
	envEndpoints    = "WALDENCTL_ENDPOINTS"
	envPrefix       = "WALDENCTL_"
	defaultEndpoint = "127.0.0.1:7001"
	reasonNotLeader = string(refusal.NotLeader)
	// The read consistency header and the trailers of a serializable read
	// (the server's HeaderConsistency, TrailerAnsweredBy,
	// TrailerAppliedIndex).
	headerConsistency   = "walden-consistency"
	trailerAnsweredBy   = "walden-answered-by"
	trailerAppliedIndex = "walden-applied-index"
)

// Output formats of -o.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
)

// cli holds the global flags and what every command shares: the endpoints,
// the transport credentials, the timeout and the output format.
type cli struct {
	stdout, stderr io.Writer

	endpoints []string
	output    string
	timeout   time.Duration
	cacert    string
	cert      string
	key       string
	// consistency is "l" (linearizable reads, the default) or "s"
	// (serializable: the answering member's state as it is).
	consistency string

	creds credentials.TransportCredentials
}

func (c *cli) bindFlags(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringSliceVar(&c.endpoints, "endpoints", []string{defaultEndpoint},
		"admin addresses of cluster members, host:port or http(s)://host:port, comma separated")
	f.StringVarP(&c.output, "output", "o", outTable, "output format: table, wide, json or yaml")
	f.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for one endpoint's answer; a command tries each endpoint once, and watch and --follow wait this long for their first answer")
	f.StringVar(&c.cacert, "cacert", "", "PEM file of the CA that signed the members' certificates (enables TLS)")
	f.StringVar(&c.cert, "cert", "", "PEM client certificate for mutual TLS (with --key)")
	f.StringVar(&c.key, "key", "", "PEM private key of --cert")
	f.StringVar(&c.consistency, "consistency", "l",
		"read consistency: l (linearizable: the answer includes every change committed before the read) or s (serializable: fast, from the answering member, possibly stale)")
	// Every global flag has an environment variable, as etcdctl's
	// ETCDCTL_*: WALDENCTL_ and the flag's name in capitals.
	f.VisitAll(func(fl *pflag.Flag) {
		fl.Usage += " (env " + envName(fl.Name) + ")"
	})
}

// envName is the environment variable of global flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// fromEnv sets every global flag not given on the command line from its
// environment variable.
func fromEnv(flags *pflag.FlagSet) error {
	var err error
	flags.VisitAll(func(fl *pflag.Flag) {
		v, ok := os.LookupEnv(envName(fl.Name))
		if !ok || fl.Changed || err != nil {
			return
		}
		if sv, isSlice := fl.Value.(pflag.SliceValue); isSlice {
			err = sv.Replace(strings.Split(v, ","))
		} else {
			err = fl.Value.Set(v)
		}
		if err != nil {
			err = fmt.Errorf("%s=%q: %w", envName(fl.Name), v, err)
		}
	})
	return err
}

// complete checks the global flags and builds the credentials.
func (c *cli) complete(cmd *cobra.Command) error {
	if err := fromEnv(cmd.Root().PersistentFlags()); err != nil {
		return err
	}
	switch c.output {
	case outTable, outWide, outJSON, outYAML:
	default:
		return fmt.Errorf("--output: must be table, wide, json or yaml, not %q", c.output)
	}
	if c.timeout <= 0 {
		return fmt.Errorf("--timeout: must be positive, got %s", c.timeout)
	}
	if c.consistency == "" {
		c.consistency = "l"
	}
	if c.consistency != "l" && c.consistency != "s" {
		return fmt.Errorf("--consistency: must be l (linearizable) or s (serializable), not %q", c.consistency)
	}
	if (c.cert == "") != (c.key == "") {
		return errors.New("--cert and --key must be given together")
	}
	eps, useTLS, err := parseEndpoints(c.endpoints, c.cacert != "" || c.cert != "")
	if err != nil {
		return err
	}
	c.endpoints = eps
	if !useTLS {
		c.creds = insecure.NewCredentials()
		return nil
	}
	// The member must show a coordinator's certificate: every broker
	// certificate is valid for localhost too.
	tc := &tls.Config{MinVersion: tls.VersionTLS12, VerifyConnection: mtls.RequireServerRole(authz.RoleCoordinator)}
	if c.cacert != "" {
		pool, err := mtls.CertPool(c.cacert)
		if err != nil {
			return fmt.Errorf("--cacert: %w", err)
		}
		tc.RootCAs = pool
	}
	if c.cert != "" {
		kp, err := mtls.LoadKeyPair(c.cert, c.key, false, "") // regular files; the key its owner's only
		if err != nil {
			return fmt.Errorf("--cert/--key: %w", err)
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	c.creds = mtls.Creds(tc) // handshake errors say who refused whom
	return nil
}

// parseEndpoints accepts host:port, http://host:port (plaintext) and
// https://host:port (TLS), as etcdctl does, and returns the host:port forms
// and whether to use TLS: https:// asks for it, as do the TLS flags
// (tlsFlags); an http:// endpoint with TLS flags, or a mix of http:// and
// https://, is an error.
func parseEndpoints(in []string, tlsFlags bool) ([]string, bool, error) {
	var out []string
	schemes := map[string]string{}
	var all []string
	for _, e := range in {
		all = append(all, strings.Split(e, ",")...)
	}
	for _, e := range all {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		scheme := ""
		if i := strings.Index(e, "://"); i >= 0 {
			scheme, e = strings.ToLower(e[:i]), e[i+3:]
			if scheme != "http" && scheme != "https" {
				return nil, false, fmt.Errorf("--endpoints: %s://%s: the scheme must be http or https", scheme, e)
			}
			schemes[scheme] = e
		}
		e = strings.TrimSuffix(e, "/")
		if _, _, err := net.SplitHostPort(e); err != nil {
			return nil, false, fmt.Errorf("--endpoints: %q is not host:port", e)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, false, errors.New("--endpoints: no endpoint given")
	}
	if _, ok := schemes["http"]; ok {
		if _, both := schemes["https"]; both {
			return nil, false, errors.New("--endpoints: mixes http:// and https://")
		}
		if tlsFlags {
			return nil, false, fmt.Errorf("--endpoints: http://%s is plaintext, but --cacert/--cert ask for TLS (use https://)", schemes["http"])
		}
	}
	_, https := schemes["https"]
	return out, https || tlsFlags, nil
}

// call runs rpc against the endpoints until one answers. A member that
// answers Unavailable with a leader hint sends the next attempt to the
// leader; any other Unavailable (or, when retryable is set, a deadline)
// moves on to the next endpoint. Other errors are final. A failure comes
// back as a *callError that says what went wrong in the terms of o.
func (c *cli) call(ctx context.Context, o op, retryable bool, rpc func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error) error {
	return c.callFor(ctx, o, retryable, c.timeout, rpc)
}

// callFor is call with a per-endpoint timeout of its own (a request that
// waits on purpose, such as a failover waiting for the broker's lease).
// With --consistency=s a read is sent as serializable, and the member that
// answered and its applied index are named on stderr.
func (c *cli) callFor(ctx context.Context, o op, retryable bool, perTry time.Duration, rpc func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error) error {
	coords := coordclient.New(c.endpoints, nil, grpc.WithTransportCredentials(c.creds))
	defer coords.Close()
	moveOn := func(code codes.Code) bool {
		return code == codes.Unavailable || (code == codes.DeadlineExceeded && retryable)
	}
	var trailer metadata.MD
	if c.consistency == "s" {
		ctx = metadata.AppendToOutgoingContext(ctx, headerConsistency, "s")
	}
	err := coords.Do(ctx, coordclient.Policy{PerTry: perTry, MaxAttempts: len(c.endpoints) + 3, MoveOn: moveOn},
		func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			return rpc(ctx, conn, append(opts, grpc.Trailer(&trailer))...)
		})
	if err == nil {
		if by := trailer.Get(trailerAnsweredBy); len(by) > 0 {
			fmt.Fprintf(c.stderr, "serializable read: answered by %s from its state at applied index %s (may be stale)\n",
				by[0], strings.Join(trailer.Get(trailerAppliedIndex), ""))
		}
		return nil
	}
	var none *coordclient.NoAnswerError
	if !errors.As(err, &none) {
		e := explain(o, status.Convert(err), c.timeout)
		c.suggestID(ctx, o, e)
		return c.unansweredWrite(o, retryable, e)
	}
	if ctx.Err() != nil {
		return errInterrupted
	}
	if last := none.Last(); none.Ctx != nil && !moveOn(status.Code(last.Err)) {
		return c.unansweredWrite(o, retryable, explain(o, status.Convert(last.Err), c.timeout))
	}
	return c.unansweredWrite(o, retryable, explainNoAnswer(none, c.timeout, c.noClientCert()))
}

// unansweredWrite says of a request that changes something (not
// retryable) and got no answer that it may have been carried out all the
// same, and how to check.
func (c *cli) unansweredWrite(o op, retryable bool, e *callError) *callError {
	if retryable {
		return e
	}
	return unanswered(o, e)
}

// noClientCert reports whether TLS is on without a client certificate.
func (c *cli) noClientCert() bool {
	return c.cert == "" && c.creds != nil && c.creds.Info().SecurityProtocol == "tls"
}

// wide reports whether tables show their extra columns (-o wide).
func (c *cli) wide() bool { return c.output == outWide }

// structured reports whether the output is json or yaml.
func (c *cli) structured() bool { return c.output == outJSON || c.output == outYAML }

// print writes msg as JSON or YAML (every field present, proto names) or
// calls table with an aligned tab writer.
func (c *cli) print(msg proto.Message, table func(w io.Writer)) error {
	if c.structured() {
		b, err := waldenv1.MarshalJSON(msg)
		if err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		return c.printJSONBytes(b)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// printValue writes v (a Go value with json tags) as JSON or YAML, or calls
// table.
func (c *cli) printValue(v any, table func(w io.Writer)) error {
	if c.structured() {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		return c.printJSONBytes(b)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// printJSONBytes prints a JSON document indented (json) or as YAML with
// its keys in the same order (yaml).
func (c *cli) printJSONBytes(b []byte) error {
	out, err := formatDoc(b, c.output == outYAML)
	if err != nil {
		return err
	}
	_, err = c.stdout.Write(out)
	return err
}

// formatDoc renders JSON b stably: indented JSON, or YAML in block style.
func formatDoc(b []byte, asYAML bool) ([]byte, error) {
	// protojson varies its whitespace on purpose; print a stable form.
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return nil, fmt.Errorf("encode json: %w", err)
	}
	if !asYAML {
		if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
			return nil, fmt.Errorf("encode json: %w", err)
		}
		out.WriteByte('\n')
		return out.Bytes(), nil
	}
	// JSON is YAML: decode it into nodes (which keeps the key order) and
	// encode them in block style.
	var doc yaml.Node
	if err := yaml.Unmarshal(compact.Bytes(), &doc); err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	blockStyle(&doc)
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode yaml: %w", err)
	}
	return out.Bytes(), nil
}

// blockStyle clears the flow and quoting styles JSON input leaves on n.
func blockStyle(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		n.Style = 0
		if needsQuotes(n.Value) {
			n.Style = yaml.DoubleQuotedStyle
		}
	} else {
		n.Style = 0
	}
	for _, k := range n.Content {
		blockStyle(k)
	}
}

// needsQuotes reports whether a string would read as another type (a
// number, a boolean, null) in plain YAML.
func needsQuotes(s string) bool {
	var v any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		return true
	}
	_, isString := v.(string)
	return !isString || v.(string) != s
}

// orDash shows an empty value in a table.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
