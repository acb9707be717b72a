package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"walden/coordclient"
	"walden/mtls"
)

// Names shared with the server's admin API.
const (
	envEndpoints    = "WALDENCTL_ENDPOINTS"
	defaultEndpoint = "127.0.0.1:7001"
	reasonNotLeader = coordclient.ReasonNotLeader
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

	creds credentials.TransportCredentials
}

func (c *cli) bindFlags(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringSliceVar(&c.endpoints, "endpoints", []string{defaultEndpoint},
		"admin addresses (host:port) of cluster members, comma separated; env "+envEndpoints)
	f.StringVarP(&c.output, "output", "o", "table", "output format: table or json")
	f.DurationVar(&c.timeout, "timeout", 5*time.Second, "timeout of each request to one endpoint")
	f.StringVar(&c.cacert, "cacert", "", "PEM file of the CA that signed the members' certificates (enables TLS)")
	f.StringVar(&c.cert, "cert", "", "PEM client certificate for mutual TLS (with --key)")
	f.StringVar(&c.key, "key", "", "PEM private key of --cert")
}

// complete checks the global flags and builds the credentials.
func (c *cli) complete(cmd *cobra.Command) error {
	if !cmd.Flags().Changed("endpoints") {
		if env := os.Getenv(envEndpoints); env != "" {
			c.endpoints = strings.Split(env, ",")
		}
	}
	var eps []string
	for _, e := range c.endpoints {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return errors.New("--endpoints: no endpoint given")
	}
	c.endpoints = eps
	if c.output != "table" && c.output != "json" {
		return fmt.Errorf("--output: must be table or json, got %q", c.output)
	}
	if c.timeout <= 0 {
		return fmt.Errorf("--timeout: must be positive, got %s", c.timeout)
	}
	if (c.cert == "") != (c.key == "") {
		return errors.New("--cert and --key must be given together")
	}
	if c.cacert == "" && c.cert == "" {
		c.creds = insecure.NewCredentials()
		return nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.cacert != "" {
		pool, err := mtls.CertPool(c.cacert)
		if err != nil {
			return fmt.Errorf("--cacert: %w", err)
		}
		tc.RootCAs = pool
	}
	if c.cert != "" {
		kp, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			return fmt.Errorf("--cert/--key: %w", err)
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	c.creds = credentials.NewTLS(tc)
	return nil
}

// call runs rpc against the endpoints until one answers. A member that
// answers Unavailable with a leader hint sends the next attempt to the
// leader; any other Unavailable (or, when retryable is set, a deadline)
// moves on to the next endpoint. Other errors are final.
func (c *cli) call(ctx context.Context, retryable bool, rpc func(ctx context.Context, conn grpc.ClientConnInterface, opts ...grpc.CallOption) error) error {
	coords := coordclient.New(c.endpoints, nil, grpc.WithTransportCredentials(c.creds))
	defer coords.Close()
	moveOn := func(code codes.Code) bool {
		return code == codes.Unavailable || (code == codes.DeadlineExceeded && retryable)
	}
	err := coords.Do(ctx, coordclient.Policy{PerTry: c.timeout, MaxAttempts: len(c.endpoints) + 3, MoveOn: moveOn},
		func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
			return rpc(ctx, conn, opts...)
		})
	var none *coordclient.NoAnswerError
	if !errors.As(err, &none) {
		if err == nil {
			return nil
		}
		return errors.New(describeStatus(status.Convert(err)))
	}
	if last := none.Last(); none.Ctx != nil && !moveOn(status.Code(last.Err)) {
		return errors.New(describeStatus(status.Convert(last.Err)))
	}
	var errs []string
	for _, f := range none.Failures {
		if s, ok := status.FromError(f.Err); ok {
			errs = append(errs, fmt.Sprintf("%s: %s", f.Addr, describeStatus(s)))
		} else {
			errs = append(errs, fmt.Sprintf("%s: %v", f.Addr, f.Err))
		}
	}
	if len(errs) == 1 {
		return errors.New(errs[0])
	}
	return fmt.Errorf("no endpoint answered: %s", strings.Join(errs, "; "))
}

func describeStatus(s *status.Status) string {
	return fmt.Sprintf("%s: %s", s.Code(), s.Message())
}

// print writes msg as JSON (every field present, proto names) or calls
// table with an aligned tab writer.
func (c *cli) print(msg proto.Message, table func(w io.Writer)) error {
	if c.output == "json" {
		b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(msg)
		if err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		// protojson varies its whitespace on purpose; print a stable form.
		var compact, out bytes.Buffer
		if err := json.Compact(&compact, b); err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		out.WriteByte('\n')
		_, err = c.stdout.Write(out.Bytes())
		return err
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// orDash shows an empty value in a table.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
