package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"walden/authz"
	"walden/internal/devcluster"
	waldenv1 "walden/proto/walden/v1"
)

// errDevLost is returned (exit status 1) when the demonstration's verify
// found acknowledged records lost or offsets missing.
var errDevLost = errors.New("dev: acknowledged records lost or offsets missing")

// errDevNothingRecovered is returned (exit status 1) when the failover
// recovered nothing from the victim's WAL: the demonstration did not show
// what it is for.
var errDevNothingRecovered = errors.New("dev: the failover recovered nothing from the victim's WAL")

// devOptions are the flags of `walden dev`.
type devOptions struct {
	dir            string
	keep           bool
	output         string
	timeout        time.Duration
	rate           float64
	payload        int
	warmup         time.Duration
	after          time.Duration
	backlog        int64
	uploadInterval time.Duration
	policy         string
	insecure       bool
	broker         string
}

// devUploadInterval is the brokers' upload_interval in the demonstration
// unless --upload-interval says otherwise.
const devUploadInterval = time.Hour

// devPolicies are the policies `walden dev --policy` knows.
var devPolicies = map[string][]string{
	// walden's defaults: failure_timeout 5s, lease_ttl 3s, drift_margin 500ms.
	"default": nil,
	// demo shortens detection for a quicker show.
	"demo": {"failure_timeout: 2s", "lease_ttl: 1s", "drift_margin: 200ms"},
}

// devAutomqDemoPolicy is the demo policy with --broker automq: lease_ttl
// 1.5s, so that the watchdog's margin (300ms) and the agent's safety margin
// (200ms) leave a broker time for a late renewal.
var devAutomqDemoPolicy = []string{"failure_timeout: 2s", "lease_ttl: 1500ms", "drift_margin: 200ms"}

func init() {
	var o devOptions
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the demonstration: S3, 3 coordinators, 3 brokers on loopback; kill -9 a broker under load",
		Long: `dev starts, as child processes of this binary on 127.0.0.1, an embedded S3
(walden s3), three coordinators (walden server) and three brokers (walden
broker, three streams each, takeover on). It produces records on every
stream, kills broker b1 with SIGKILL after --warmup, prints live what the
cluster does (observations, the FAILED decision and its evidence, fencing,
the recovery job's steps and progress, streams closed and reopened on other
brokers), then verifies every acknowledged record and prints a summary:
detection time (kill -> FAILED committed), recovery time (kill -> recovery
job done, every stream of b1 closed), reopen time (kill -> every stream
open on another broker), producer-visible unavailability per stream,
records acknowledged and lost, and what the recovery read from b1's WAL
and uploaded (bytes and record batches: the brokers upload only every
--upload-interval, 1h by default, so b1 dies holding records S3 lacks).

It exits with status 1 when an acknowledged record is lost, offsets have
gaps, or the failover recovered nothing. --keep leaves the cluster running (until Ctrl-C) and prints how to
look at it with waldenctl. Every process runs mutual TLS with roles (a
throwaway CA, the gossip key and the certificates in DIR/pki, made as
"walden certs" does); --insecure runs them in plaintext without
authorization instead. Configs, data and logs go to --dir; without it, to
a temporary directory that is removed after a successful run and kept (and
named) after a failure. --backlog builds that many bytes of un-uploaded
WAL on b1 before the kill (brokers then upload only every
--upload-interval).

--broker automq runs AutoMQ's failover instead (docs/walden-dev.md): the
development AutoMQ controller (walden automq dev-controller, three voters),
coordinators that recover with recovery.action automq, and three brokers in
mode automq (AutoMQ 1.x brokers: node id and node epoch in their WALs,
AutoMQ's controller protocol and S3 objects, no lease), each started by a
walden agent in watchdog mode. The kill -9 hits b1's broker process; its
agent lives on, sees it dead, stops renewing, and the cluster fails node 1
over at AutoMQ's controller: GetOpeningStreams in failover mode, AutoMQ
objects from its WAL, CommitStreamSetObject, the WAL reset, CloseStreams.
The new leaders' OpenStreams get STREAM_NOT_CLOSED until then, and succeed
at the new end offsets. The load finds leaders through the brokers, and the
verify reads every record from AutoMQ's objects in S3 through the
controller's offsets.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dir, "dir", "", "working directory for configs, data, WALs and logs (default: a new temporary directory)")
	f.BoolVar(&o.keep, "keep", false, "leave the cluster running after the demonstration (Ctrl-C stops it)")
	f.StringVarP(&o.output, "output", "o", "table", "output format: table (live) or json (summary only)")
	f.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up when a step takes longer than this")
	f.Float64Var(&o.rate, "rate", 300, "records per second over all streams")
	f.IntVar(&o.payload, "payload", 64, "bytes per record")
	f.DurationVar(&o.warmup, "warmup", 5*time.Second, "load before the kill")
	f.DurationVar(&o.after, "after", 2*time.Second, "load after the streams reopened")
	f.Int64Var(&o.backlog, "backlog", 0, "bytes of un-uploaded WAL to build on the victim before the kill (e.g. 67108864)")
	f.DurationVar(&o.uploadInterval, "upload-interval", 0, "brokers' upload_interval (default 1h: the victim dies with records in its WAL that S3 lacks, and the failover recovers them)")
	f.BoolVar(&o.insecure, "insecure", false, "run in plaintext without authorization (default: mutual TLS with roles, a throwaway CA in --dir)")
	f.StringVar(&o.policy, "policy", "default", "failover policy: default (walden's defaults) or demo (failure_timeout 2s, lease_ttl 1s; 1.5s with --broker automq)")
	f.StringVar(&o.broker, "broker", devcluster.BrokerWalden, "brokers: walden (the reference broker) or automq (AutoMQ-mode brokers, each beside a walden agent in watchdog mode, and the development AutoMQ controller)")
	rootCmd.AddCommand(cmd)
}

func runDev(ctx context.Context, o devOptions, out io.Writer) error {
	if o.output != "table" && o.output != "json" {
		return fmt.Errorf("dev: -o: must be table or json, not %q", o.output)
	}
	policy, ok := devPolicies[o.policy]
	if !ok {
		return fmt.Errorf("dev: --policy: must be default or demo, not %q", o.policy)
	}
	if o.backlog < 0 {
		return fmt.Errorf("dev: --backlog: must not be negative")
	}
	if o.broker != devcluster.BrokerWalden && o.broker != devcluster.BrokerAutomq {
		return fmt.Errorf("dev: --broker: must be %s or %s, not %q", devcluster.BrokerWalden, devcluster.BrokerAutomq, o.broker)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	say := func(line string) {
		if o.output == "table" {
			fmt.Fprintf(out, "%s %6.1fs  %s\n", time.Now().Format("15:04:05.000"), time.Since(start).Seconds(), line)
		}
	}

	dir, removeDir := o.dir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "walden-dev-")
		if err != nil {
			return fmt.Errorf("dev: %w", err)
		}
		dir, removeDir = d, true
	}
	// A temporary directory goes away after a successful run; after a
	// failure it stays, with the logs the error names.
	succeeded := false
	defer func() {
		if removeDir && succeeded {
			os.RemoveAll(dir)
		}
	}()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("dev: find own binary: %w", err)
	}
	opts := devcluster.Options{Bin: exe, Dir: dir, Policy: policy, UploadInterval: o.uploadInterval, Insecure: o.insecure, Broker: o.broker}
	if o.broker == devcluster.BrokerAutomq && o.policy == "demo" {
		// A broker that never checks its lease is killed by its watchdog
		// kill_margin before the lease ends: with lease_ttl 1s a renewal
		// a little late on a busy host kills a healthy broker. The demo
		// policy of AutoMQ mode leaves the broker more room.
		opts.Policy = devAutomqDemoPolicy
		opts.LeaseSafetyMargin, opts.KillMargin = 200*time.Millisecond, 300*time.Millisecond
	}
	if opts.UploadInterval == 0 {
		// The brokers keep what they write in their WALs instead of
		// uploading it every second, so that the victim dies holding
		// records S3 lacks and the failover has them to recover (with 1s,
		// a kill right after an upload recovered nothing).
		opts.UploadInterval = devUploadInterval
	}
	if o.backlog > 0 {
		// The WAL holds the backlog and the warm-up without uploading:
		// upload_bytes at most half the capacity.
		capacity := (2*o.backlog + 64<<20 + 4095) / 4096 * 4096
		opts.WALCapacity, opts.UploadBytes, opts.BacklogStreams = capacity, capacity/2, true
	}
	c, err := devcluster.New(opts)
	if err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	defer func() {
		if !o.keep || ctx.Err() != nil {
			c.Close()
		}
	}()
	if c.IsAutomq() {
		say(fmt.Sprintf("starting S3, the development AutoMQ controller, 3 coordinators (recovery.action automq), %d AutoMQ-mode brokers each started by its agent in watchdog mode, in %s (logs: %s/*.log)",
			len(c.Brokers), dir, dir))
	} else {
		say(fmt.Sprintf("starting S3, 3 coordinators, %d brokers in %s (logs: %s/*.log)", len(c.Brokers), dir, dir))
	}
	webScheme := "http"
	if c.PKI != "" {
		webScheme = "https"
		say(fmt.Sprintf("mutual TLS with roles: a throwaway CA, the gossip key and every certificate in %s (coordinator c1..c3, broker b1..b%d, admin for this command)",
			c.PKI, len(c.Brokers)))
	} else {
		say("plaintext, no authorization (--insecure)")
	}
	if err := c.Start(ctx, o.timeout); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	for _, m := range c.Coords {
		say(fmt.Sprintf("  coordinator %s  admin %s  raft %s  gossip %s  pid %d  web view %s://%s/ui/", m.Name, m.Admin, m.Raft, m.Gossip, m.Pid(), webScheme, m.HTTP))
	}
	if c.IsAutomq() {
		say(fmt.Sprintf("  AutoMQ controller (cluster %s)  voters %s  metadata view %s/v1/state  pid %d", devcluster.AutomqClusterID,
			strings.Join(c.Automq.Voters, ","), c.MetadataURL(), c.Automq.Controller.Pid()))
	}
	for _, b := range c.Brokers {
		if c.IsAutomq() {
			ab, _ := c.AgentBroker(ctx, b)
			say(fmt.Sprintf("  broker %s  AutoMQ node %d  data %s  streams %v  pid %d, beside its agent %s (watchdog)  pid %d", b.Name,
				devcluster.NodeOf(b), b.Listen, b.Streams, ab.PID, b.AgentListen, b.Pid()))
			continue
		}
		say(fmt.Sprintf("  broker %s  data %s  agent %s  streams %v  pid %d", b.Name, b.Listen, b.AgentListen, b.Streams, b.Pid()))
	}
	if p, err := devPolicy(ctx, c); err == nil {
		say(fmt.Sprintf("policy %q: failure_timeout %dms, lease_ttl %dms, drift_margin %dms, suspicion_quorum %s",
			o.policy, p.GetFailureTimeoutMs(), p.GetLeaseTtlMs(), p.GetDriftMarginMs(), quorumText(p.GetSuspicionQuorum())))
	}

	sc := &devcluster.Failover{Rate: o.rate, Payload: o.payload, Warmup: o.warmup, After: o.after, Backlog: o.backlog,
		Timeout: o.timeout, Say: say}
	sum, err := sc.Run(ctx, c)
	if err != nil {
		return fmt.Errorf("dev: %w (logs in %s)", err, dir)
	}
	sum.Policy = o.policy
	if o.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else {
		devPrintSummary(out, sum, o.policy)
	}
	if sum.Lost > 0 || sum.Gaps > 0 || sum.Duplicates > 0 || sum.Unbacked > 0 {
		return fmt.Errorf("%w: lost %d, gaps %d, duplicates %d, unbacked %d (logs in %s)", errDevLost, sum.Lost, sum.Gaps, sum.Duplicates,
			sum.Unbacked, dir)
	}
	if sum.UploadedBytes == 0 || sum.RecordsRecovered == 0 {
		return fmt.Errorf("%w: %s of %s's WAL were not in S3 at the kill (logs in %s)", errDevNothingRecovered,
			devcluster.FormatBytes(sum.BacklogBytes), sum.Victim, dir)
	}
	if !o.keep {
		succeeded = true
		return nil
	}
	eps := strings.Join(c.AdminAddrs(), ",")
	var tlsEnv, loadFlags, web, reader string
	if c.PKI != "" {
		admin, err := c.TLSOf(devcluster.ClientIdentity)
		if err != nil {
			return fmt.Errorf("dev: %w", err)
		}
		rd, err := c.TLSOf(authz.Identity{Name: "dev-reader", Role: authz.RoleReader})
		if err != nil {
			return fmt.Errorf("dev: %w", err)
		}
		tlsEnv = fmt.Sprintf("  export WALDENCTL_CACERT=%s WALDENCTL_CERT=%s WALDENCTL_KEY=%s\n", admin.CAFile, admin.CertFile, admin.KeyFile)
		loadFlags = fmt.Sprintf(" --cacert %s --cert %s --key %s", rd.CAFile, rd.CertFile, rd.KeyFile)
		web = fmt.Sprintf(" (it asks for a client certificate: walden certs issue --dir %s --name me --role reader --p12 me.p12, import me.p12 and %s/ca.pem into the browser: docs/operating.md)", c.PKI, c.PKI)
		reader = fmt.Sprintf("  WALDENCTL_CERT=%s WALDENCTL_KEY=%s waldenctl failover b2 --reason try   # a reader: refused\n", rd.CertFile, rd.KeyFile)
	}
	if c.IsAutomq() {
		devKeepAutomq(out, c, sum, eps, tlsEnv, loadFlags, dir)
		<-ctx.Done()
		succeeded = true
		return nil
	}
	fmt.Fprintf(out, `
the cluster keeps running (Ctrl-C stops it); %s was killed, the other brokers serve its streams.
  web view: %s://%s/ui/%s
  export WALDENCTL_ENDPOINTS=%s
%s  waldenctl status
  waldenctl brokers
  waldenctl jobs
  waldenctl streams
  waldenctl events --limit 30
%s  walden load --coordinators %s --rate 100 --duration 10s --ledger %s/more.jsonl%s
logs and data: %s%s
`, sum.Victim, webScheme, c.Coords[0].HTTP, web, eps, tlsEnv, reader, eps, dir, loadFlags, dir,
		map[bool]string{true: " (removed on Ctrl-C; --dir keeps them)", false: ""}[removeDir])
	<-ctx.Done()
	succeeded = true
	return nil
}

func quorumText(q uint32) string {
	if q == 0 {
		return "majority"
	}
	return fmt.Sprint(q)
}

func devPolicy(ctx context.Context, c *devcluster.Cluster) (*waldenv1.Policy, error) {
	var p *waldenv1.Policy
	err := c.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
		r, err := waldenv1.NewBrokersClient(cc).GetPolicy(ctx, &waldenv1.GetPolicyRequest{})
		p = r.GetPolicy()
		return err
	})
	return p, err
}

func devPrintSummary(out io.Writer, s *devcluster.Summary, policy string) {
	fmt.Fprintf(out, "\nsummary (policy %s): broker %s killed with SIGKILL, owner of %d streams", policy, s.Victim, s.VictimStreams)
	if s.BacklogBytes > 0 {
		fmt.Fprintf(out, ", %s of WAL not uploaded", devcluster.FormatBytes(s.BacklogBytes))
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  detection (kill -> FAILED committed)\t%d ms\n", s.DetectionMs)
	fmt.Fprintf(tw, "  recovery (kill -> its streams closed, job %s on %s, attempt %d)\t%d ms\n",
		s.JobID, s.JobAssignee, s.JobAttempts, s.RecoveryMs)
	fmt.Fprintf(tw, "  recovered from %s's WAL to S3\t%s in %d record batches (%s were not in S3 at the kill)\n",
		s.Victim, devcluster.FormatBytes(s.UploadedBytes), s.RecordsRecovered, devcluster.FormatBytes(s.BacklogBytes))
	fmt.Fprintf(tw, "  reopen (kill -> its streams open on other brokers)\t%d ms\n", s.ReopenMs)
	fmt.Fprintf(tw, "  producer-visible unavailability, max / median over streams\t%d ms / %d ms\n", s.MaxUnavailableMs, s.MedianUnavailableMs)
	fmt.Fprintf(tw, "  records acknowledged / present / lost / gaps / duplicates\t%d / %d / %d / %d / %d\n", s.Acked, s.Present, s.Lost, s.Gaps, s.Duplicates)
	fmt.Fprintf(tw, "  %s's epoch\t%d -> %d (fenced)\n", s.Victim, s.OldEpoch, s.NewEpoch)
	tw.Flush()
	if s.Automq != nil {
		for _, line := range devAutomqLines(s) {
			fmt.Fprintln(out, "  "+line)
		}
	}
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  STREAM\tACKED\tMAX_UNAVAILABLE\tOWNERS")
	for _, st := range s.Streams {
		fmt.Fprintf(tw, "  %d\t%d\t%d ms\t%s\n", st.Stream, st.Acked, st.MaxUnavailableMs, strings.Join(st.Owners, ","))
	}
	tw.Flush()
	if s.Lost == 0 && s.Gaps == 0 && s.Duplicates == 0 && s.Unbacked == 0 {
		fmt.Fprintln(out, "OK: no acknowledged record lost, no gaps, no record stored twice")
	} else {
		fmt.Fprintln(out, "FAILED: acknowledged records lost, gaps, or records stored twice")
	}
}

// devAutomqLines is the AutoMQ side of the summary.
func devAutomqLines(s *devcluster.Summary) []string {
	a := s.Automq
	var objs []string
	for _, o := range a.Objects {
		objs = append(objs, fmt.Sprintf("%d (%s, %s)", o.ObjectID, o.Kind, devcluster.FormatBytes(o.Size)))
	}
	out := []string{fmt.Sprintf("AutoMQ node %d, epoch %d: fenced at the controller, objects %s committed, WAL reset %t",
		a.NodeID, a.NodeEpoch, strings.Join(objs, ", "), a.WALReset)}
	for _, st := range a.Streams {
		out = append(out, fmt.Sprintf("  stream %d: end offset %d -> %d (%d record batches from the WAL), leader now %s",
			st.StreamID, st.EndOffsetBefore, st.EndOffsetAfter, st.Records, st.Leader))
	}
	out = append(out, fmt.Sprintf("new leaders' OpenStreams answered STREAM_NOT_CLOSED %d times until the failover closed the streams",
		a.NotClosedAnswers))
	if a.NodeEpochAfter != 0 {
		out = append(out, fmt.Sprintf("%s started again by its agent as node %d epoch %d (its WAL held nothing to upload)", s.Victim,
			a.NodeID, a.NodeEpochAfter))
	}
	return out
}

// devKeepAutomq says how to look at a kept cluster of AutoMQ-mode brokers.
func devKeepAutomq(out io.Writer, c *devcluster.Cluster, s *devcluster.Summary, eps, tlsEnv, loadFlags, dir string) {
	var streams, pids []string
	for _, id := range c.AllStreams() {
		streams = append(streams, fmt.Sprint(id))
	}
	for _, b := range c.Brokers {
		if ab, err := c.AgentBroker(context.Background(), b); err == nil && ab.PID > 0 {
			pids = append(pids, fmt.Sprint(ab.PID))
		}
	}
	fmt.Fprintf(out, `
the cluster keeps running (Ctrl-C stops it); %s's broker was killed, the other brokers lead its streams.
  the AutoMQ controller's view: curl %s/v1/state   (/v1/streams, /v1/objects?state=COMMITTED)
  export WALDENCTL_ENDPOINTS=%s
%s  waldenctl brokers
  waldenctl job %s       # the AutoMQ failover: node, epoch, objects, end offsets
  waldenctl events --limit 30
  curl http://%s/v1/broker   # what %s's agent says of its broker
  walden load --brokers %s --streams %s --rate 100 --duration 10s --ledger %s/more.jsonl%s
  kill -USR1 %s   # the brokers upload their WALs now (every %s otherwise): verify reads S3 only
  AWS_ACCESS_KEY_ID=%s AWS_SECRET_ACCESS_KEY=%s walden verify --automq %s --s3-endpoint %s --s3-bucket %s --s3-path-style --ledger %s/more.jsonl
logs and data: %s
`, s.Victim, c.MetadataURL(), eps, tlsEnv, s.JobID, c.Brokers[0].AgentListen, c.Brokers[0].Name, strings.Join(c.BrokerAddrs(), ","),
		strings.Join(streams, ","), dir, loadFlags, strings.Join(pids, " "), c.Opts.UploadInterval, c.S3Config.AccessKeyID, c.S3Config.SecretAccessKey, c.MetadataURL(), c.S3Config.Endpoint,
		c.S3Config.Bucket, dir, dir)
}
