package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"walden/automq/devcontroller"
)

func init() { automqCmd.AddCommand(newAutomqDevControllerCmd()) }

// devControllerFlags are the flags of `walden automq dev-controller`.
type devControllerFlags struct {
	config     string
	clusterID  string
	listen     []string
	voters     int
	streams    string
	http       string
	tlsCert    string
	tlsKey     string
	tlsCA      string
	saslUsers  []string
	saslMechs  []string
	output     string
	verbose    bool
	httpListen net.Listener // tests: a listener for --http
}

// newAutomqDevControllerCmd builds `walden automq dev-controller`.
func newAutomqDevControllerCmd() *cobra.Command {
	var f devControllerFlags
	cmd := &cobra.Command{
		Use:   "dev-controller",
		Short: "Run a development AutoMQ 1.4.1 controller quorum (stream metadata, in memory; development and tests only)",
		Long: `Run a development stand-in for the controller quorum of an AutoMQ 1.4.1
cluster: it speaks AutoMQ's controller extension protocol (OpenStreams,
CloseStreams, PrepareS3Object, CommitStreamSetObject, GetOpeningStreams,
AutomqGetNodes, with ApiVersions and SASL) on one listener per voter, and
keeps the stream metadata with AutoMQ 1.4.1's rules: node epochs and the
failover flag, stream epochs and ranges, prepared objects with their time to
live, and the commit checks. It is what walden's end-to-end tests,
'walden dev --broker automq' and the chaos harness run where no AutoMQ can.

The state lives in memory for the life of the process: nothing is written to
disk, and a restart forgets every node, stream offset and object. Never use
it in production. docs/automq-devcontroller.md says what it models and what it
simplifies.

--voters N serves N voters; voter 1 is active and the others answer
NOT_CONTROLLER, so that clients walk the voter list. With one --listen
address and N voters, port 0 gives each voter a free port and port P the
ports P to P+N-1; or give one --listen per voter. --http serves the state as
JSON (GET /v1/state, /v1/streams, /v1/objects, /v1/nodes) and moves the
active voter (POST /v1/active {"voter": N}); it has no authentication, keep it
on loopback.

--streams creates the streams CLOSED at offset 0, as AutoMQ's CreateStreams
leaves them ("0-99,1000"). TLS and SASL (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512) are the controller listener's security; --config FILE reads a
YAML file with the same settings and node registrations (flags override it).

Once listening it prints each voter's address and the HTTP endpoint (-o json:
one JSON object on one line), then serves until SIGTERM or SIGINT.`,
		Example: `  walden automq dev-controller --cluster-id dev --listen 127.0.0.1:0 --voters 3 --streams 0-15 --http 127.0.0.1:0 -o json
  walden automq dev-controller --config devcontroller.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDevController(cmd, &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "YAML file of settings and node registrations (see docs/automq-devcontroller.md)")
	fl.StringVar(&f.clusterID, "cluster-id", "", "AutoMQ cluster id: names the objects' key namespace _kafka_<id> (required here or in the file)")
	fl.StringSliceVar(&f.listen, "listen", []string{"127.0.0.1:9093"}, "voter address(es) HOST:PORT: one per voter, or one for all (port 0: free ports)")
	fl.IntVar(&f.voters, "voters", 1, "number of controller voters; voter 1 is active")
	fl.StringVar(&f.streams, "streams", "", "stream ids to create, as ids and ranges: 0-99,1000")
	fl.StringVar(&f.http, "http", "", "address HOST:PORT of the JSON inspection endpoint (off when empty)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "certificate file of the listeners (TLS: the SSL or SASL_SSL listener)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "key file of --tls-cert")
	fl.StringVar(&f.tlsCA, "tls-client-ca", "", "CA file: require client certificates signed by it")
	fl.StringArrayVar(&f.saslUsers, "sasl-user", nil, "SASL user USER:PASSWORD (repeat for several); turns SASL on")
	fl.StringSliceVar(&f.saslMechs, "sasl-mechanism", nil, "accepted SASL mechanisms: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (default all three)")
	fl.StringVarP(&f.output, "output", "o", "text", "output format: text or json")
	fl.BoolVar(&f.verbose, "verbose", false, "log at debug level")
	return cmd
}

// devControllerReady is what the command prints once it listens.
type devControllerReady struct {
	ClusterID   string   `json:"cluster_id"`
	Voters      []string `json:"voters"`
	ActiveVoter int      `json:"active_voter"`
	HTTP        string   `json:"http,omitempty"`
}

func runDevController(cmd *cobra.Command, f *devControllerFlags) error {
	if f.output != "text" && f.output != "json" {
		return fmt.Errorf("dev-controller: --output %q: use text or json", f.output)
	}
	fc, err := devControllerSettings(cmd, f)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if f.verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
	tlsCfg, err := fc.TLS.ServerTLS()
	if err != nil {
		return fmt.Errorf("dev-controller: %w", err)
	}
	ctrl, err := devcontroller.New(devcontroller.Config{
		ClusterID: fc.ClusterID,
		Streams:   fc.Streams,
		Nodes:     fc.Nodes,
		TLS:       tlsCfg,
		SASL:      fc.SASL,
		Logger:    logger,
	})
	if err != nil {
		return fmt.Errorf("dev-controller: %w", err)
	}
	addrs, err := voterAddrs(fc.Listen, fc.Voters)
	if err != nil {
		return err
	}
	lns := make([]net.Listener, 0, len(addrs))
	closeAll := func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}
	for i, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			closeAll()
			return fmt.Errorf("dev-controller: voter %d: %w", i+1, err)
		}
		lns = append(lns, ln)
	}
	if err := ctrl.Start(lns...); err != nil {
		closeAll()
		return fmt.Errorf("dev-controller: %w", err)
	}
	defer ctrl.Close()

	ready := devControllerReady{ClusterID: fc.ClusterID, Voters: ctrl.Addrs(), ActiveVoter: ctrl.Active()}
	var httpSrv *http.Server
	if fc.HTTP != "" || f.httpListen != nil {
		hl := f.httpListen
		if hl == nil {
			if hl, err = net.Listen("tcp", fc.HTTP); err != nil {
				return fmt.Errorf("dev-controller: --http: %w", err)
			}
		}
		if host, _, err := net.SplitHostPort(hl.Addr().String()); err == nil {
			if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
				logger.Warn("the inspection endpoint listens beyond loopback: it has no authentication and can move the active voter", "http", hl.Addr().String())
			}
		}
		httpSrv = &http.Server{Handler: ctrl.HTTPHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := httpSrv.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("inspection endpoint stopped", "err", err)
			}
		}()
		ready.HTTP = "http://" + hl.Addr().String()
	}
	printDevControllerReady(cmd.OutOrStdout(), f.output, ready)

	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	logger.Info("stopping the development controller; its state is gone with it")
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = httpSrv.Shutdown(sctx)
	}
	return ctrl.Close()
}

func printDevControllerReady(w io.Writer, output string, r devControllerReady) {
	if output == "json" {
		b, _ := json.Marshal(r)
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintf(w, "development AutoMQ controller %s (in memory: development and tests only)\n", r.ClusterID)
	for i, a := range r.Voters {
		role := "standby"
		if i+1 == r.ActiveVoter {
			role = "active"
		}
		fmt.Fprintf(w, "voter %d %s %s\n", i+1, a, role)
	}
	if r.HTTP != "" {
		fmt.Fprintf(w, "http %s\n", r.HTTP)
	}
}

// devControllerSettings merges the file (if any) and the flags given.
func devControllerSettings(cmd *cobra.Command, f *devControllerFlags) (*devcontroller.FileConfig, error) {
	fc := &devcontroller.FileConfig{}
	if f.config != "" {
		var err error
		if fc, err = devcontroller.LoadFile(f.config); err != nil {
			return nil, fmt.Errorf("dev-controller: %w", err)
		}
	}
	changed := cmd.Flags().Changed
	if changed("cluster-id") {
		fc.ClusterID = f.clusterID
	}
	if changed("listen") || len(fc.Listen) == 0 {
		fc.Listen = f.listen
	}
	if changed("voters") || fc.Voters == 0 {
		fc.Voters = f.voters
		if !changed("voters") && len(fc.Listen) > 1 {
			fc.Voters = len(fc.Listen)
		}
	}
	if changed("streams") {
		ids, err := devcontroller.ParseStreams(f.streams)
		if err != nil {
			return nil, fmt.Errorf("dev-controller: --streams: %w", err)
		}
		fc.Streams = ids
	}
	if changed("http") {
		fc.HTTP = f.http
	}
	if changed("tls-cert") || changed("tls-key") || changed("tls-client-ca") {
		fc.TLS = devcontroller.FileTLS{CertFile: f.tlsCert, KeyFile: f.tlsKey, ClientCAFile: f.tlsCA}
		if (fc.TLS.CertFile == "") != (fc.TLS.KeyFile == "") {
			return nil, errors.New("dev-controller: --tls-cert and --tls-key go together")
		}
		if fc.TLS.ClientCAFile != "" && fc.TLS.CertFile == "" {
			return nil, errors.New("dev-controller: --tls-client-ca needs --tls-cert and --tls-key")
		}
	}
	if changed("sasl-user") || changed("sasl-mechanism") {
		sc := &devcontroller.SASLConfig{Mechanisms: f.saslMechs, Users: map[string]string{}}
		if fc.SASL != nil {
			sc.Users, sc.Iterations = fc.SASL.Users, fc.SASL.Iterations
			if !changed("sasl-mechanism") {
				sc.Mechanisms = fc.SASL.Mechanisms
			}
		}
		if changed("sasl-user") {
			sc.Users = map[string]string{}
		}
		for _, u := range f.saslUsers {
			name, pass, ok := strings.Cut(u, ":")
			if !ok || name == "" || pass == "" {
				return nil, fmt.Errorf("dev-controller: --sasl-user %q: use USER:PASSWORD", u)
			}
			sc.Users[name] = pass
		}
		if err := sc.Validate(); err != nil {
			flag := map[string]string{"sasl.users": "--sasl-user", "sasl.mechanisms": "--sasl-mechanism"}
			var se *devcontroller.SASLConfigError
			if errors.As(err, &se) && flag[se.Key] != "" {
				return nil, fmt.Errorf("dev-controller: %s: %s", flag[se.Key], se.Reason)
			}
			return nil, fmt.Errorf("dev-controller: %w", err)
		}
		fc.SASL = sc
	}
	if fc.ClusterID == "" {
		return nil, errors.New("dev-controller: --cluster-id is required (or cluster_id in --config): it names the objects' key namespace _kafka_<id>")
	}
	if fc.Voters < 1 {
		return nil, fmt.Errorf("dev-controller: --voters %d: at least 1", fc.Voters)
	}
	return fc, nil
}

// voterAddrs gives each voter its address: one --listen per voter, or one
// address for all (port 0: free ports; port P: P, P+1...).
func voterAddrs(listen []string, voters int) ([]string, error) {
	if len(listen) == voters {
		return listen, nil
	}
	if len(listen) != 1 {
		return nil, fmt.Errorf("dev-controller: %d --listen addresses for %d voters: give one per voter, or one for all", len(listen), voters)
	}
	host, port, err := net.SplitHostPort(listen[0])
	if err != nil {
		return nil, fmt.Errorf("dev-controller: --listen %q: %w", listen[0], err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+voters-1 > 65535 {
		return nil, fmt.Errorf("dev-controller: --listen %q: port must be 0 or leave room for %d voters", listen[0], voters)
	}
	out := make([]string, voters)
	for i := range out {
		q := 0
		if p != 0 {
			q = p + i
		}
		out[i] = net.JoinHostPort(host, strconv.Itoa(q))
	}
	return out, nil
}
