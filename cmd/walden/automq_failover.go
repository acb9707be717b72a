package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"walden/automq/controller"
	"walden/automq/failover"
	"walden/config"
	"walden/objstore"
)

// errFailoverIncomplete is returned (exit status 1) when the failover did
// not close every opening stream or dropped records.
var errFailoverIncomplete = errors.New("the failover is not complete")

// automqFailoverFlags are the flags of `walden automq failover`.
type automqFailoverFlags struct {
	wal         string
	nodeID      int32
	nodeEpoch   int64
	controllers string
	clusterID   string
	s3Endpoint  string
	s3Bucket    string
	s3Region    string
	s3PathStyle bool
	config      string
	output      string
	timeout     time.Duration
	verbose     bool
}

func init() { automqCmd.AddCommand(newAutomqFailoverCmd()) }

func newAutomqFailoverCmd() *cobra.Command {
	var f automqFailoverFlags
	cmd := &cobra.Command{
		Use:   "failover --wal PATH --node-id N --controllers HOST:PORT[,...] --cluster-id ID --s3-bucket NAME",
		Short: "Fail a dead AutoMQ 1.x broker over by hand: upload its WAL, commit it and close its streams",
		Long: `failover does for one dead AutoMQ 1.x broker what AutoMQ's own failover code
does (Client#failover, which nothing calls in AutoMQ 1.4), and what a walden
cluster does with recovery.action: automq — the same code:

  1. reads the WAL's header: it must name --node-id; the node epoch is the
     larger of the header's and the controller's (or --node-epoch);
  2. GetOpeningStreams in failover mode, which fences the node at the
     controller: its own opens and commits are refused from then on;
  3. reads the WAL from its trim offset and keeps, as AutoMQ does, the
     records of the node's opening streams beyond their end offsets;
  4. PrepareS3Object, then uploads them as AutoMQ objects (a stream-set
     object, stream objects for the large streams) under AutoMQ's keys;
  5. CommitStreamSetObject in failover mode;
  6. resets the WAL (in its own format version), so the broker starts empty;
  7. CloseStreams as the dead node: the new partition leaders' OpenStreams,
     refused with STREAM_NOT_CLOSED until then, succeed.

Run it only for a broker that is dead and stays dead (stopped, its machine
off or its volume detached): a broker still writing its WAL would lose what
it acknowledges after the read. Running it again is safe: what was committed
is not committed again.

The controller is reached on its controller listener (the addresses of
controller.quorum.voters). Controller TLS and SASL, the block size, the
split size and the bucket index come from --config, a YAML file with the keys
of a coordinator's recovery.automq section; flags win over it. S3 credentials
come from the AWS SDK's usual chain (AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, a profile, an instance role), or s3.access_key_id and
s3.secret_access_key in --config.

It exits 0 only when every opening stream was closed and nothing was dropped;
-o json prints one object at the end (node_id, node_epoch, streams, objects,
bytes_uploaded, wal_reset, duration_ms), progress goes to stderr on a
terminal.`,
		Example: `  walden automq failover --wal /dev/nvme1n1 --node-id 3 --controllers 10.0.0.1:9093,10.0.0.2:9093,10.0.0.3:9093 \
      --cluster-id rZdE0DjZSrqy96PXrMUZVw --s3-bucket automq-data --s3-region eu-west-1
  walden automq failover --config automq.yaml --wal /mnt/b3/wal --node-id 3 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAutomqFailover(cmd.Context(), f, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.wal, "wal", "", "the dead broker's WAL file or device (read, then reset at the end)")
	fl.Int32Var(&f.nodeID, "node-id", -1, "the broker's AutoMQ node id (node.id)")
	fl.Int64Var(&f.nodeEpoch, "node-epoch", 0, "the node epoch to fail over (default: the larger of the WAL header's and the controller's)")
	fl.StringVar(&f.controllers, "controllers", "", "the controllers' host:port on the controller listener, comma-separated (controller.quorum.voters without the ids)")
	fl.StringVar(&f.clusterID, "cluster-id", "", "the AutoMQ cluster id (it names the objects' keys)")
	fl.StringVar(&f.s3Endpoint, "s3-endpoint", "", "the S3 endpoint URL (default: AWS's)")
	fl.StringVar(&f.s3Bucket, "s3-bucket", "", "AutoMQ's data bucket")
	fl.StringVar(&f.s3Region, "s3-region", "", "the bucket's region (default us-east-1)")
	fl.BoolVar(&f.s3PathStyle, "s3-path-style", false, "address the bucket in the path (MinIO and other S3-compatible servers)")
	fl.StringVar(&f.config, "config", "", "a YAML file with the keys of recovery.automq (controller TLS and SASL, block_size, stream_split_size, bucket_index...)")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	fl.DurationVar(&f.timeout, "timeout", time.Hour, "give up after this long")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "log the failover's decisions to stderr")
	return cmd
}

func runAutomqFailover(ctx context.Context, f automqFailoverFlags, out, errOut io.Writer) error {
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("automq failover: -o: must be table or json, not %q", f.output)
	}
	if f.wal == "" {
		return errors.New("automq failover: --wal is required: the dead broker's WAL file or device")
	}
	if f.nodeID < 0 {
		return errors.New("automq failover: --node-id is required: the broker's AutoMQ node id")
	}
	if f.nodeEpoch < 0 {
		return errors.New("automq failover: --node-epoch: must not be negative")
	}
	cfg, err := config.LoadAutoMQFailover(f.config, func(c *failover.Config) {
		if f.clusterID != "" {
			c.ClusterID = f.clusterID
		}
		if f.controllers != "" {
			c.Controller.Voters = splitList(f.controllers)
		}
		if f.s3Bucket != "" {
			c.S3.Bucket = f.s3Bucket
		}
		if f.s3Endpoint != "" {
			c.S3.Endpoint = f.s3Endpoint
		}
		if f.s3Region != "" {
			c.S3.Region = f.s3Region
		}
		if f.s3PathStyle {
			c.S3.PathStyle = true
		}
	})
	if err != nil {
		return fmt.Errorf("automq failover: %w", flagNames(err))
	}
	if cfg.S3.Bucket == "" {
		return errors.New("automq failover: --s3-bucket is required (or s3.bucket in --config): AutoMQ's data bucket")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: level}))
	cc, err := cfg.ControllerClientConfig()
	if err != nil {
		return fmt.Errorf("automq failover: %w", err)
	}
	cc.Logger = logger
	ctl, err := controller.New(cc)
	if err != nil {
		return fmt.Errorf("automq failover: %w", err)
	}
	defer ctl.Close()
	store, err := objstore.New(ctx, cfg.S3, objstore.Options{Logger: logger})
	if err != nil {
		return fmt.Errorf("automq failover: s3: %w", err)
	}

	progress := newFailoverProgress(errOut, isTerminal(errOut))
	fo, err := failover.New(cfg, ctl, store, failover.Options{Logger: logger, Observe: progress.step, Uploaded: progress.uploaded})
	if err != nil {
		return fmt.Errorf("automq failover: %w", err)
	}
	rep, runErr := fo.Run(ctx, failover.Request{WALPath: f.wal, NodeID: f.nodeID, NodeEpoch: f.nodeEpoch})
	progress.finish()
	if rep != nil {
		if f.output == "json" {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			if err := enc.Encode(failoverJSON(rep, runErr)); err != nil {
				return err
			}
		} else {
			printFailoverReport(out, rep)
		}
	}
	if runErr != nil {
		return runErr
	}
	if !rep.Complete() {
		return errFailoverIncomplete
	}
	return nil
}

// failoverOut is the JSON of `walden automq failover -o json`.
type failoverOut struct {
	*failover.Report
	Complete bool   `json:"complete"`
	Error    string `json:"error,omitempty"`
}

func failoverJSON(rep *failover.Report, err error) failoverOut {
	o := failoverOut{Report: rep, Complete: err == nil && rep.Complete()}
	if rep.Streams == nil {
		rep.Streams = []failover.StreamReport{}
	}
	if rep.Objects == nil {
		rep.Objects = []failover.ObjectReport{}
	}
	if err != nil {
		o.Error = err.Error()
	}
	return o
}

func printFailoverReport(w io.Writer, rep *failover.Report) {
	fmt.Fprintf(w, "node %d, epoch %d: %s, %d bytes uploaded in %s, WAL %s\n", rep.NodeID, rep.NodeEpoch,
		countText(int64(rep.Records), "record", "records")+" committed", rep.BytesUploaded, time.Duration(rep.DurationMS)*time.Millisecond,
		map[bool]string{true: "reset", false: "not reset"}[rep.WALReset])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tEPOCH\tEND BEFORE\tEND AFTER\tRECORDS\tCLOSED\tPROBLEM")
	for _, s := range rep.Streams {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%s\t%s\n", s.StreamID, s.StreamEpoch, s.EndOffsetBefore, s.EndOffsetAfter, s.Records,
			map[bool]string{true: "yes", false: "no"}[s.Closed], s.Problem)
	}
	tw.Flush()
	if len(rep.Objects) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "OBJECT\tKIND\tSIZE\tSTATE\tKEY")
		for _, o := range rep.Objects {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", o.ObjectID, o.Kind, o.Size, o.State, o.Key)
		}
		tw.Flush()
	}
	for _, g := range rep.Gaps {
		fmt.Fprintf(w, "note: %s\n", g)
	}
}

func countText(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// failoverProgress prints the steps and the upload's progress on a
// terminal.
type failoverProgress struct {
	w       io.Writer
	on      bool
	start   time.Time
	lastLen int
	done    chan struct{}
	bytes   chan [2]int64
}

func newFailoverProgress(w io.Writer, on bool) *failoverProgress {
	p := &failoverProgress{w: w, on: on, start: time.Now(), done: make(chan struct{}), bytes: make(chan [2]int64, 1)}
	if on {
		go p.loop()
	} else {
		close(p.done)
	}
	return p
}

func (p *failoverProgress) step(ev failover.Event) error {
	if !p.on || !ev.Done {
		return nil
	}
	p.line(fmt.Sprintf("%6.1fs  %-7s %s", time.Since(p.start).Seconds(), ev.Step, ev.Detail), true)
	return nil
}

func (p *failoverProgress) uploaded(done, total int64) {
	if !p.on {
		return
	}
	select {
	case <-p.bytes:
	default:
	}
	select {
	case p.bytes <- [2]int64{done, total}:
	default:
	}
}

// loop redraws the upload line at most every 200 ms.
func (p *failoverProgress) loop() {
	defer close(p.done)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	var last [2]int64
	for {
		select {
		case b, ok := <-p.bytes:
			if !ok {
				return
			}
			last = b
		case <-t.C:
			if last[1] > 0 {
				p.line(fmt.Sprintf("%6.1fs  upload  %d of %d bytes (%d%%)", time.Since(p.start).Seconds(), last[0], last[1], 100*last[0]/last[1]), false)
				last = [2]int64{}
			}
		}
	}
}

// line prints s over the transient line; keep says it stays.
func (p *failoverProgress) line(s string, keep bool) {
	pad := ""
	if n := p.lastLen - len(s); n > 0 {
		pad = strings.Repeat(" ", n)
	}
	if keep {
		fmt.Fprintf(p.w, "\r%s%s\n", s, pad)
		p.lastLen = 0
		return
	}
	fmt.Fprintf(p.w, "\r%s%s", s, pad)
	p.lastLen = len(s)
}

func (p *failoverProgress) finish() {
	if p.on {
		close(p.bytes)
		<-p.done
		if p.lastLen > 0 {
			fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.lastLen))
		}
	}
}

// flagNames says a config error about a key the command also takes as a
// flag in the flag's name.
func flagNames(err error) error {
	var ce *config.Error
	if !errors.As(err, &ce) || ce.File != "" {
		return err
	}
	flag := map[string]string{"cluster_id": "--cluster-id", "controller.voters": "--controllers", "s3.bucket": "--s3-bucket",
		"s3.endpoint": "--s3-endpoint", "s3.region": "--s3-region"}
	for key, name := range flag {
		if ce.Key == key || strings.HasPrefix(ce.Key, key+"[") {
			return fmt.Errorf("%s: %s", name, ce.Reason)
		}
	}
	return err
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
